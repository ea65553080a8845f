"""Dense prefill as a path: the layer's weights dequantized once to bf16, torch grouped GEMMs
(``sglang_glm5.prefill``). It has no tiles to tune: ``moe.fused_moe`` takes it from
``SGLANG_GLM5_DENSE_PREFILL_MIN_TOKENS`` tokens per expert on sm_90 / sm_100, or when asked for
(path="dense"). ``selfcheck --path dense`` runs the op on that path against the float64 reference.
"""

from __future__ import annotations

from sglang_glm5.hardware import runs_dense_prefill
from sglang_glm5.variants import KernelVariant

VARIANT = KernelVariant(
    name="dense",
    title="dense prefill",
    requires="a GPU with a native torch._grouped_mm (sm_90 / sm_100)",
    runs_on=runs_dense_prefill,
    selfcheck="sglang_glm5.cli:selfcheck_command",
)
