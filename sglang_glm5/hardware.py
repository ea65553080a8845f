"""GPU targets and every capability question: which tiles fit, how fast weights stream, which paths run.

Shared memory is the opt-in maximum per block (``cudaDevAttrMaxSharedMemoryPerBlockOptin``), the
limit that decides whether a kernel launches at all. Bandwidths are datasheet values, used only for
floors and predictions; measured numbers come from ``sglang-glm5 bench``.

Which path an architecture can run (compute capability as major * 10 + minor):

- W4A16 kernels (``moe``): ``runs_w4a16``, SM80 and newer (bf16 ``mma.sync``, ``fma.rn.bf16x2``);
- W4A4 (``w4a4``): ``runs_w4a4``, SM12x only: the block-scaled FP4 ``mma.sync ... kind::mxf4nvf4``
  exists there (sm_90 compiles ``dot_scaled`` to a bf16 upcast); ``w4a4_problem`` asks a device;
- dense prefill (``prefill``): ``runs_dense_prefill``, sm_90 and sm_100, where torch's bf16
  ``_grouped_mm`` is a native CUTLASS grouped GEMM; ``dense_prefill_available`` asks a device;
- pipelined tiles: ``keeps_every_stage``, whether a software pipeline of num_stages keeps num_stages
  operand buffers in shared memory (wgmma / TMA parts) or num_stages - 1 (``mma.sync`` + ``cp.async``
  parts), as Triton's AOT compiles for sm_90 and sm_120 show (``variants.w4a16_tiles.model_shared_bytes``).

Nothing here imports torch at module level: the SGLang plugin asks these questions at start-up.
"""

from __future__ import annotations

from dataclasses import dataclass

# Opt-in shared memory per block by compute capability (CUDA programming guide, "Technical
# Specifications per Compute Capability").
SHARED_PER_BLOCK = {
    80: 166912,  # A100
    86: 101376,  # RTX 30xx, A40
    87: 166912,  # Jetson Orin
    89: 101376,  # RTX 40xx, L40S
    90: 232448,  # H100, H200
    100: 232448,  # B200, GB200
    103: 232448,  # B300
    120: 101376,  # RTX PRO 6000 Blackwell, RTX 50xx
    121: 101376,  # DGX Spark (GB10)
}
# Shared memory an SM holds for its resident blocks, and what the driver reserves of it for each block (same source):
# how many programs of a tile can be resident on an SM by shared memory (``programs_by_shared``).
SHARED_PER_SM = {80: 167936, 86: 102400, 87: 167936, 89: 102400, 90: 233472, 100: 233472, 103: 233472, 120: 102400,
                 121: 102400}  # fmt: skip
RESERVED_PER_BLOCK = 1024


@dataclass(frozen=True)
class GpuTarget:
    name: str  # short name used on the command line and in cache keys
    arch: int  # compute capability as major * 10 + minor
    device_name: str  # what torch.cuda.get_device_name() reports
    shared_per_block: int  # bytes a block may use (opt-in maximum)
    sm_count: int
    mem_bandwidth: float  # bytes/s, datasheet
    dense_bf16_flops: float = 0.0  # FLOP/s, datasheet, dense tensor cores (the step model's compute ceilings)
    dense_fp4_flops: float = 0.0  # FLOP/s, datasheet, dense block-scaled FP4 (0: no FP4 tensor cores)

    @property
    def sm(self) -> str:
        return f"sm_{self.arch}"

    def fits(self, shared_bytes: int) -> bool:
        return shared_bytes <= self.shared_per_block

    def programs_by_shared(self, shared_bytes: int) -> int:
        """Programs of a kernel using ``shared_bytes`` that an SM holds at once as far as shared memory goes (other
        limits, registers and warps, may hold fewer): 1 for an RTX PRO 6000 at 53248 B, 3 at 26624 B."""
        per_sm = SHARED_PER_SM.get(self.arch, self.shared_per_block + RESERVED_PER_BLOCK)
        return per_sm // (shared_bytes + RESERVED_PER_BLOCK)


TARGETS = {
    t.name: t
    for t in (
        GpuTarget("rtx-pro-6000", 120, "NVIDIA RTX PRO 6000 Blackwell Workstation Edition", 101376, 188, 1.79e12,
                  504e12, 2e15),  # BF16 and FP4 dense: shared/FACTS.md
        GpuTarget("rtx-pro-6000-server", 120, "NVIDIA RTX PRO 6000 Blackwell Server Edition", 101376, 188, 1.6e12),
        GpuTarget(
            "rtx-pro-6000-maxq", 120, "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition", 101376, 188, 1.79e12
        ),  # fmt: skip
        GpuTarget("rtx-5090", 120, "NVIDIA GeForce RTX 5090", 101376, 170, 1.79e12),
        GpuTarget("dgx-spark", 121, "NVIDIA GB10", 101376, 48, 0.273e12),
        GpuTarget("h200", 90, "NVIDIA H200", 232448, 132, 4.8e12, 989e12),  # BF16 dense, SXM datasheet
        GpuTarget("h100", 90, "NVIDIA H100 80GB HBM3", 232448, 132, 3.35e12, 989e12),  # BF16 dense, SXM datasheet
        GpuTarget("b200", 100, "NVIDIA B200", 232448, 148, 8.0e12),
        GpuTarget("a100", 80, "NVIDIA A100-SXM4-80GB", 166912, 108, 2.04e12),
        GpuTarget("l40s", 89, "NVIDIA L40S", 101376, 142, 0.864e12),
    )
}
DEFAULT_TARGET = "rtx-pro-6000"


def detect(device: int = 0) -> GpuTarget:
    """The local GPU as a target; a known device name keeps its short name and bandwidth."""
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("no CUDA device: name a target instead (" + ", ".join(TARGETS) + ")")
    props = torch.cuda.get_device_properties(device)
    arch = props.major * 10 + props.minor
    shared = getattr(props, "shared_memory_per_block_optin", 0) or SHARED_PER_BLOCK.get(arch, 49152)
    for t in TARGETS.values():
        if t.device_name == props.name and t.arch == arch:
            return GpuTarget(t.name, arch, props.name, shared, props.multi_processor_count, t.mem_bandwidth)
    slug = props.name.lower().replace("nvidia ", "").replace(" ", "-")
    return GpuTarget(slug, arch, props.name, shared, props.multi_processor_count, 0.0)


def resolve(name: str) -> GpuTarget:
    """A named target, 'local' (the GPU of this machine), or 'sm_XY' / 'smXY' (a generic part)."""
    if name == "local":
        return detect()
    if name in TARGETS:
        return TARGETS[name]
    digits = name.lower().removeprefix("sm").lstrip("_")
    if digits.isdigit() and int(digits) in SHARED_PER_BLOCK:
        arch = int(digits)
        return GpuTarget(f"sm{arch}", arch, f"generic sm_{arch}", SHARED_PER_BLOCK[arch], 0, 0.0)
    known = ", ".join([*TARGETS, "local", *(f"sm{a}" for a in SHARED_PER_BLOCK)])
    raise ValueError(f"target: unknown {name!r}; expected one of {known}")


# ---------------------------------------------------------------------------------------------
# Which paths an architecture runs.

W4A16_MIN_ARCH = 80


def is_sm12x(arch: int) -> bool:
    """The Blackwell workstation family (sm_120 RTX PRO 6000 / RTX 50xx, sm_121 GB10): 101376 B per block."""
    return arch // 10 == 12


def runs_w4a16(arch: int) -> bool:
    """The W4A16 kernels: bf16 tensor cores and ``fma.rn.bf16x2``, SM80 and newer."""
    return arch >= W4A16_MIN_ARCH


def runs_w4a4(arch: int) -> bool:
    """The W4A4 kernels: block-scaled FP4 ``mma.sync`` (kind::mxf4nvf4), SM12x only."""
    return is_sm12x(arch)


def runs_dense_prefill(arch: int) -> bool:
    """Dense prefill: torch's bf16 ``_grouped_mm`` is a native grouped GEMM on sm_90 and sm_100 only."""
    return arch // 10 in (9, 10)


def launches_dependents(arch: int) -> bool:
    """Programmatic dependent launch (``griddepcontrol`` in PTX, the launch attribute in the driver): sm_90+."""
    return arch >= 90


def wgmma_from_registers(arch: int) -> bool:
    """Whether Triton's W4A16 dots run as wgmma with the decoded weights as the register operand (sm_90), whose
    fragment gives a thread words 2t, 2t + 1, 2t + 8, 2t + 9 of each 16 (the "kernel_wgmma" layout pairs them
    under one block scale). SM80/SM120 run mma.sync, whose operand Triton lays out 4 adjacent words a thread."""
    return arch == 90


def keeps_every_stage(arch: int) -> bool:
    """Whether a pipeline of num_stages keeps num_stages operand buffers in shared memory (wgmma / TMA:
    Hopper and the Blackwell datacenter parts) rather than num_stages - 1 (``mma.sync`` + ``cp.async``:
    SM80/86/89/120). Read from Triton's AOT compiles: a bf16 128x128x64 tile at 4 stages takes 98304 B
    on sm_120 and 131072 B on sm_90."""
    return arch in (90, 100, 103)


# ---------------------------------------------------------------------------------------------
# Asking a device (torch is imported only here, when a device is asked about).


def device_arch(device=None) -> int | None:
    """Compute capability (major * 10 + minor) of a CUDA device (default: the current one); None for a
    device that is not CUDA or when torch sees no CUDA device."""
    import torch

    if device is not None:
        device = torch.device(device)
        if device.type != "cuda":
            return None
    if not torch.cuda.is_available():
        return None
    query = torch.cuda.get_device_capability
    if device is None or device.index is None:  # the current device, which may change
        major, minor = query(device)
        return major * 10 + minor
    # A device's capability does not change while the process runs, and the op asks on every call (each query
    # several microseconds): remembered per device index and query function (a test's stand-in GPU has its own).
    key = (device.index, query)
    arch = _ARCHS.get(key)
    if arch is None:
        major, minor = query(device)
        arch = _ARCHS[key] = major * 10 + minor
    return arch


_ARCHS: dict[tuple, int] = {}


def w4a4_problem(device) -> str | None:
    """None when ``device`` can run W4A4 (a CUDA device of SM12x); otherwise what it is instead, for an
    error message ("no tensor", "cpu", "sm_90", ...)."""
    import torch

    if device is None:
        return "no tensor"
    device = torch.device(device)
    if device.type != "cuda":
        return str(device)
    arch = device_arch(device)
    if arch is None:
        return f"{device}, but torch sees no CUDA device"
    return None if runs_w4a4(arch) else f"sm_{arch}"


def dense_prefill_available(device) -> bool:
    """Whether ``device`` runs the dense prefill path: a CUDA device of sm_90 / sm_100 and a torch with
    ``_grouped_mm``."""
    import torch

    if torch.device(device).type != "cuda" or not hasattr(torch, "_grouped_mm"):
        return False
    arch = device_arch(device)
    return arch is not None and runs_dense_prefill(arch)
