"""For scripts/gpu/plugin/pytest_plugin.py: records, in each test, PyTorch's own view of its GPU memory beside
the plugin's (`--gpumem`), so that the script can print both.

An autouse fixture resets PyTorch's peak statistics when the test starts and, when it ends, records
the growth of `torch.cuda.max_memory_reserved()` over the reserve at its start, and what each module
holds then (`gpumemhook.breakdown()`), the memory PyTorch's allocator does not see named by the
library that asked for it. `--torch-figures FILE` receives them as JSON at the end of the session.
"""

from __future__ import annotations

import json

import pytest

import gpumemhook
from gpumemhook import _native

_figures = {}


def pytest_addoption(parser):
    parser.addoption("--torch-figures", metavar="FILE", default=None,
                     help="write each test's PyTorch memory figures to FILE (JSON)")


def pytest_sessionstart(session):
    # CUDA (and PyTorch's allocator) started before the first test, so that the first test's figures
    # are its own and not the context's set-up.
    import torch

    torch.cuda.init()


@pytest.fixture(autouse=True)
def torch_memory(request):
    import torch

    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    reserved_at_start = torch.cuda.memory_reserved()
    modules_at_start = {m: used for (m, used, _, _) in gpumemhook.breakdown(0)}
    yield
    torch.cuda.synchronize()
    _figures[request.node.nodeid] = {
        "reserved_at_start": reserved_at_start,
        "max_reserved_growth": torch.cuda.max_memory_reserved() - reserved_at_start,
        "modules": [
            {"module": m, "used": used, "growth": used - modules_at_start.get(m, 0)}
            for (m, used, _, _) in gpumemhook.breakdown(0)
        ],
    }


def pytest_sessionfinish(session):
    path = session.config.getoption("--torch-figures")
    if path:
        _native.write_file(path, json.dumps(_figures, indent=1).encode())
