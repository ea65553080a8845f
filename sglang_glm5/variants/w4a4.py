"""The W4A4 kernel family: activations quantized to NVFP4, block-scaled FP4 tensor cores (SM12x only).

The kernels, their tiles, shared-memory model and ahead-of-time compiles live in ``sglang_glm5.w4a4``
(with the op and its CPU emulation); the search space, the benchmarks and what ``tune`` does after
storing the tiles (time the op against W4A16, check against float64, store the threshold) in
``sglang_glm5.w4a4_tune``. NOT YET RUN ON SM120 HARDWARE.
"""

from __future__ import annotations

from sglang_glm5 import w4a4, w4a4_tune
from sglang_glm5.hardware import runs_w4a4
from sglang_glm5.variants import KernelVariant

VARIANT = KernelVariant(
    name="w4a4",
    title="W4A4",
    requires="an SM12x GPU (RTX PRO 6000, RTX 50xx)",
    runs_on=runs_w4a4,
    kernels=w4a4.KERNELS,
    revision=w4a4.KERNEL_REVISION,
    key_prefix="w4a4_",
    tune_buckets=w4a4_tune.TUNE_BUCKETS,
    heuristic=w4a4.heuristic_config,
    search_space=w4a4_tune.search_space,
    model_shared_bytes=lambda kernel, cfg, target: w4a4.model_shared_bytes(kernel, cfg),
    compiled_shared_bytes=lambda items, target: w4a4.compiled_shared_bytes_many(items, target.arch),
    kernel_bencher="sglang_glm5.w4a4_tune:kernel_bencher",
    after_tune="sglang_glm5.w4a4_tune:after_tune",
    selfcheck="sglang_glm5.w4a4_verify:selfcheck_command",
)
