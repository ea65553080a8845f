"""Kernels run on the CPU through the Triton interpreter unless a GPU is there (SGLANG_GLM5_TEST_DEVICE)."""

import os

import pytest
import torch

# Set before any module decorates a kernel: triton.jit reads it at decoration time.
if os.environ.get("SGLANG_GLM5_TEST_DEVICE", "cpu") == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"


@pytest.fixture
def device() -> torch.device:
    return torch.device(os.environ.get("SGLANG_GLM5_TEST_DEVICE", "cpu"))


@pytest.fixture
def gen(request) -> torch.Generator:
    """A generator with a fresh seed, printed so that a failure can be replayed (SGLANG_GLM5_SEED)."""
    seed = int(os.environ.get("SGLANG_GLM5_SEED", "0")) or int.from_bytes(os.urandom(4), "little")
    print(f"{request.node.name}: seed {seed}")
    g = torch.Generator()
    g.manual_seed(seed)
    return g
