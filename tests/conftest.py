"""Shared fixtures: the built-in tiny model (built once per session) and device selection."""
from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# Without a GPU, Triton kernels can only run in its interpreter, and the flag must be
# set before triton is first imported (it decides how @triton.jit functions are built).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_addoption(parser):
    parser.addoption("--device", default="cpu", choices=["cpu", "cuda"],
                     help="device the engine tests run on (cuda: the same tests on a GPU)")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def device(pytestconfig) -> str:
    name = pytestconfig.getoption("--device")
    if name == "cuda" and not torch.cuda.is_available():
        pytest.skip("--device cuda given but no CUDA device")
    return name


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    from courseware.tiny_model import make_tiny_model
    return str(make_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0))
