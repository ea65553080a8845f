"""Capability questions (``sglang_glm5.hardware``): which paths a GPU can run, asked of targets and devices."""

from __future__ import annotations

import pytest
import torch

from sglang_glm5 import hardware, prefill
from sglang_glm5.hardware import SHARED_PER_BLOCK, TARGETS

# (arch, runs W4A16, runs W4A4, runs dense prefill, keeps every pipeline stage in shared memory)
CASES = [
    (80, True, False, False, False),  # A100: mma.sync, no grouped-GEMM prefill
    (89, True, False, False, False),  # L40S
    (90, True, False, True, True),  # H100/H200: wgmma, _grouped_mm native
    (100, True, False, True, True),  # B200
    (103, True, False, True, True),  # B300: major 10, as B200
    (120, True, True, False, False),  # RTX PRO 6000 / RTX 50xx: FP4 mma.sync, mma.sync pipelines
    (121, True, True, False, False),  # GB10
    (75, False, False, False, False),  # Turing: below the W4A16 kernels' SM80
]


@pytest.mark.parametrize("arch, w4a16, w4a4, dense, every_stage", CASES)
def test_paths_by_architecture(arch, w4a16, w4a4, dense, every_stage):
    assert hardware.runs_w4a16(arch) is w4a16
    assert hardware.runs_w4a4(arch) is w4a4
    assert hardware.is_sm12x(arch) is w4a4
    assert hardware.runs_dense_prefill(arch) is dense
    assert hardware.keeps_every_stage(arch) is every_stage


def test_every_sm12x_target_has_sm120_shared_memory():
    """The shipped sm_120 cache entries are read by every target of this arch and shared memory."""
    sm12x = {t.name for t in TARGETS.values() if hardware.is_sm12x(t.arch)}
    assert {"rtx-pro-6000", "rtx-pro-6000-server", "rtx-pro-6000-maxq", "rtx-5090", "dgx-spark"} == sm12x
    assert {TARGETS[n].shared_per_block for n in sm12x} == {SHARED_PER_BLOCK[120]}
    maxq = TARGETS["rtx-pro-6000-maxq"]
    assert maxq.device_name == "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition" and maxq.arch == 120


def test_devices_without_cuda():
    cpu = torch.device("cpu")
    assert hardware.device_arch(cpu) is None
    assert hardware.w4a4_problem(cpu) == "cpu"
    assert hardware.w4a4_problem(None) == "no tensor"
    assert not hardware.dense_prefill_available(cpu) and not prefill.available(cpu)


@pytest.mark.parametrize("arch", [90, 100, 120, 80])
def test_a_cuda_device_is_asked_its_capability(monkeypatch, arch):
    """A faked CUDA device of each arch: the device questions agree with the arch questions."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: divmod(arch, 10))
    cuda = torch.device("cuda", 0)
    assert hardware.device_arch(cuda) == arch
    assert hardware.w4a4_problem(cuda) == (None if hardware.runs_w4a4(arch) else f"sm_{arch}")
    has_grouped_mm = hasattr(torch, "_grouped_mm")
    assert prefill.available(cuda) is (has_grouped_mm and hardware.runs_dense_prefill(arch))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert hardware.w4a4_problem(cuda) == "cuda:0, but torch sees no CUDA device"
    assert hardware.device_arch(cuda) is None


def test_a_devices_capability_is_asked_once_per_index(monkeypatch):
    # The op asks on every call; a device's capability is remembered per index, and per query function (a stand-in
    # GPU gets its own answers); "cuda" without an index is the current device, which may change: asked each time.
    asked = []

    def query(device=None):
        asked.append(device)
        return (9, 0)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", query)
    assert [hardware.device_arch(torch.device("cuda", 1)) for _ in range(3)] == [90] * 3
    assert hardware.device_arch("cuda:2") == 90
    assert len(asked) == 2, asked
    assert hardware.device_arch("cuda") == hardware.device_arch("cuda") == 90
    assert len(asked) == 4, asked
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (12, 0))
    assert hardware.device_arch(torch.device("cuda", 1)) == 120
