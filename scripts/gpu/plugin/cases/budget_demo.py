"""For scripts/gpu/plugin/pytest_plugin.py: a budget the test passes and one it breaks, on the GPU (run
separately, as `pytest scripts/gpu/plugin/cases/budget_demo.py`: its name keeps it out of the
convnet run)."""

import pytest
import torch


@pytest.mark.gpumem(peak="300MiB", leak="0B")
def test_within_its_budget():
    x = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    del x


@pytest.mark.gpumem(peak="64MiB")
def test_over_its_budget():
    x = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    del x
