"""A small convolutional network's forward and backward at two batch sizes (cuDNN convolutions,
a cuBLAS matrix product), for scripts/gpu/plugin/pytest_plugin.py. Everything is made inside the test, so that
with --gpumem-empty-cache a test's figures are its own."""

import pytest
import torch
from torch import nn


def convnet() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 64, 3, padding=1),
        nn.BatchNorm2d(64),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(64, 128, 3, padding=1),
        nn.BatchNorm2d(128),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(128 * 16 * 16, 10),
    )


@pytest.mark.parametrize("batch", [32, 256])
def test_forward_backward(batch):
    torch.manual_seed(0)
    model = convnet().cuda()
    x = torch.randn(batch, 3, 64, 64, device="cuda")
    target = torch.randint(0, 10, (batch,), device="cuda")
    loss = nn.functional.cross_entropy(model(x), target)
    loss.backward()
    torch.cuda.synchronize()
    assert torch.isfinite(loss)
