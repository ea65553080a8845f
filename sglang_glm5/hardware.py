"""GPU targets: the numbers that decide which tiles fit and how fast weights can stream.

Shared memory is the opt-in maximum per block (``cudaDevAttrMaxSharedMemoryPerBlockOptin``), the
limit that decides whether a kernel launches at all. Bandwidths are datasheet values, used only for
floors and predictions; measured numbers come from ``sglang-glm5 bench``.
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


@dataclass(frozen=True)
class GpuTarget:
    name: str  # short name used on the command line and in cache keys
    arch: int  # compute capability as major * 10 + minor
    device_name: str  # what torch.cuda.get_device_name() reports
    shared_per_block: int  # bytes a block may use (opt-in maximum)
    sm_count: int
    mem_bandwidth: float  # bytes/s, datasheet

    @property
    def sm(self) -> str:
        return f"sm_{self.arch}"

    def fits(self, shared_bytes: int) -> bool:
        return shared_bytes <= self.shared_per_block


TARGETS = {
    t.name: t
    for t in (
        GpuTarget("rtx-pro-6000", 120, "NVIDIA RTX PRO 6000 Blackwell Workstation Edition", 101376, 188, 1.79e12),
        GpuTarget("rtx-pro-6000-server", 120, "NVIDIA RTX PRO 6000 Blackwell Server Edition", 101376, 188, 1.6e12),
        GpuTarget("rtx-5090", 120, "NVIDIA GeForce RTX 5090", 101376, 170, 1.79e12),
        GpuTarget("dgx-spark", 121, "NVIDIA GB10", 101376, 48, 0.273e12),
        GpuTarget("h200", 90, "NVIDIA H200", 232448, 132, 4.8e12),
        GpuTarget("h100", 90, "NVIDIA H100 80GB HBM3", 232448, 132, 3.35e12),
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
