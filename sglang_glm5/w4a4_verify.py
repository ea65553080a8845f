"""Checking the W4A4 path on an SM12x GPU: what ``sglang-glm5 selfcheck --path w4a4`` runs there, and what
``tune --path w4a4`` runs before it stores a threshold. Nothing here has run on SM120 hardware.

``run_selfcheck``: W4A4 and W4A16 on random GLM-5-shaped NVFP4 layers at several token counts, against
the float64 reference (W4A4 within the bound NVFP4 activation quantization implies, and against its
torch emulation). The numbers it compares with (``reference_intermediates``, ``calibrated_input_scales``,
``activation_error_bound``) are the ones tests/test_w4a4.py checks the emulation with.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from sglang_glm5 import nvfp4, w4a4

# Tolerances of the W4A4 kernels against their torch emulation (tests/test_w4a4.py): a requantized h code
# can flip at a rounding boundary when fp32 sums run in another order; the rest agrees to bf16 rounding.
EMULATION_RMS, EMULATION_MAX = 0.02, 0.1
W4A16_REL = 1e-2  # the W4A16 op against the float64 reference (the plain selfcheck's limit)


# ---------------------------------------------------------------------------------------------
# The numbers the self-check (and tests/test_w4a4.py) compare with.


def reference_intermediates(
    x: torch.Tensor, w13: torch.Tensor, w13_scale: torch.Tensor, w13_scale_2: torch.Tensor,
    topk_ids: torch.Tensor, w13_order: str = "gate_up",
) -> list[torch.Tensor]:  # fmt: skip
    """h = silu(x Wg^T) * (x Wu^T) in float64, per local expert, over the tokens routed to it."""
    num_experts, two_i, _ = w13.shape
    inter = two_i // 2
    gs = w13_scale_2.double().reshape(num_experts, -1).expand(num_experts, 2)
    out = []
    for e in range(num_experts):
        token = torch.nonzero(topk_ids == e, as_tuple=True)[0]
        w = nvfp4.dequantize(w13[e], w13_scale[e], 1.0, torch.float64)
        first, second = w[:inter], w[inter:]
        wg, wu = (first, second) if w13_order == "gate_up" else (second, first)
        xe = x[token].double()
        out.append(torch.nn.functional.silu(xe @ wg.T * gs[e, 0]) * (xe @ wu.T * gs[e, 1]))
    return out


def calibrated_input_scales(x: torch.Tensor, h: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """ModelOpt's calibration on this batch: amax / (448 * 6). -> (w13 [E, 2], w2 [E]) fp32."""
    a1 = torch.full((len(h), 2), float(x.float().abs().max()) / 2688.0, device=x.device)
    a2 = torch.tensor([float(v.abs().max()) / 2688.0 if v.numel() else 1.0 for v in h], device=x.device)
    return a1, a2


@dataclass(frozen=True)
class ErrorBound:
    bound: float  # RMS relative error W4A4 may have against the float64 reference
    eps_x: float  # RMS relative error of quantizing x to NVFP4
    eps_h: float  # the same for the intermediate h


def rel_errors(err: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    """(RMS relative error, max error / max |ref|)."""
    return float(err.norm() / ref.norm()), float(err.abs().max() / ref.abs().max())


def activation_error_bound(
    x: torch.Tensor, w13_input_scale: torch.Tensor, h: list[torch.Tensor], w2_input_scale: torch.Tensor
) -> ErrorBound:
    """The RMS error NVFP4 activations imply, measured on this x and this h.

    The weights are the same NVFP4 values on both sides, so the difference comes from quantizing x
    (eps_x) and h (eps_h). Quantization errors are nearly uncorrelated with the weights, so a GEMM keeps
    the relative RMS error of its input; gate and up each carry eps_x and h = silu(gate) * up combines
    them (|d silu(g)/dg| * |g| / |silu(g)| <= ~1.1), giving ~sqrt(2.4) eps_x in h, then the
    requantization adds eps_h: expected RMS error sqrt(2.4 eps_x^2 + eps_h^2). Factor 1.5 for the
    finite sample (a few hundred outputs per expert) and the bf16 rounding of y and out (2^-9, far below).
    """
    a1 = torch.as_tensor(w13_input_scale, dtype=torch.float32).max()
    a2 = torch.as_tensor(w2_input_scale, dtype=torch.float32)
    xf = x.float()
    eps_x = rel_errors(nvfp4.quantize(xf, a1.to(xf.device)).dequantize() - xf, xf)[0]
    routed = [(e, v) for e, v in enumerate(h) if v.numel()]  # experts with no token add nothing
    hh = torch.cat([v for _, v in routed])
    hq = torch.cat([w4a4.quantize_dequantize(v.float(), a2 if a2.dim() == 0 else a2[e]) for e, v in routed])
    eps_h = rel_errors(hq.double() - hh, hh)[0]
    return ErrorBound(1.5 * (2.4 * eps_x**2 + eps_h**2) ** 0.5, eps_x, eps_h)


# ---------------------------------------------------------------------------------------------
# The self-check.


@dataclass(frozen=True)
class CheckRow:
    num_tokens: int
    tokens_per_expert: float
    w4a16_rel: float  # RMS relative error against float64
    w4a4_rms: float
    w4a4_max: float  # max error / max |ref|
    bound: float
    vs_emulation: float  # RMS relative error of the W4A4 op against its torch emulation
    w4a16_ms: float  # first call, synchronized: includes compilation on a fresh cache
    w4a4_ms: float
    problems: tuple[str, ...]  # empty: passed

    HEADER = ("|     T | tok/expert | W4A16 rel err | W4A4 rms | bound  | W4A4 max/max | W4A4 vs emulation "
              "| W4A16 ms | W4A4 ms | result")  # fmt: skip

    def line(self) -> str:
        return (
            f"| {self.num_tokens:5d} | {self.tokens_per_expert:10.1f} | {self.w4a16_rel:13.2e} | {self.w4a4_rms:8.4f} "
            f"| {self.bound:.4f} | {self.w4a4_max:12.4f} | {self.vs_emulation:17.2e} | {self.w4a16_ms:8.1f} "
            f"| {self.w4a4_ms:7.1f} | {'ok' if not self.problems else 'FAIL: ' + '; '.join(self.problems)}"
        )


@dataclass(frozen=True)
class SelfCheckResult:
    rows: tuple[CheckRow, ...]

    @property
    def passed(self) -> bool:
        return bool(self.rows) and not any(r.problems for r in self.rows)


def w4a16_kwargs() -> dict:
    """Keywords that pin ``nvfp4_fused_moe`` to W4A16."""
    return {"path": "w4a16"}


def _row_problems(w4a16_rel, rms, worst, eb: ErrorBound, emu_rms, emu_max, finite) -> tuple[str, ...]:
    out = []
    if not finite:
        out.append("non-finite output")
    if not w4a16_rel < W4A16_REL:
        out.append(f"W4A16 rel err {w4a16_rel:.2e} >= {W4A16_REL}")
    if not 0.03 < eb.eps_x < 0.2:
        out.append(f"eps_x {eb.eps_x:.3f} outside (0.03, 0.2): the bound's measurement is off")
    if not rms <= eb.bound:
        out.append(f"W4A4 rms {rms:.4f} > bound {eb.bound:.4f}")
    if not worst <= 4 * eb.bound:
        out.append(f"W4A4 max/max {worst:.4f} > {4 * eb.bound:.4f}")
    if not (emu_rms < EMULATION_RMS and emu_max < EMULATION_MAX):
        out.append(f"vs emulation rms {emu_rms:.4f} / max {emu_max:.4f} (limits {EMULATION_RMS}, {EMULATION_MAX})")
    return tuple(out)


def run_selfcheck(
    shape,
    tokens: Sequence[int],
    device: torch.device,
    gen: torch.Generator,
    *,
    w4a4_op: Callable[..., torch.Tensor] | None = None,
    w4a16_op: Callable[..., torch.Tensor] | None = None,
    say: Callable[[str], None] = print,
) -> SelfCheckResult:
    """W4A4 and W4A16 on random NVFP4 layers of ``shape`` (a MoeShape) at each token count, against the
    float64 reference. Passed when every row passes.

    w4a4_op(x, *layer, topk_weights, topk_ids, w13_input_scale, w2_input_scale) defaults to
    ``nvfp4_fused_moe_w4a4``, w4a16_op(x, *layer, topk_weights, topk_ids) to ``nvfp4_fused_moe`` pinned
    to W4A16. The CLI passes the defaults (``tune --path w4a4`` pins the tiles it picked); tests inject the
    interpreter's kernels or a broken op.
    """
    from sglang_glm5.reference import nvfp4_fused_moe_reference
    from sglang_glm5.testing import random_layer, random_routing

    if w4a4_op is None:
        w4a4_op = w4a4.nvfp4_fused_moe_w4a4
    if w4a16_op is None:
        from functools import partial

        from sglang_glm5.moe import nvfp4_fused_moe

        w4a16_op = partial(nvfp4_fused_moe, **w4a16_kwargs())

    def timed(fn, *args):
        t0 = time.perf_counter()
        out = fn(*args)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return out, (time.perf_counter() - t0) * 1e3

    layer = random_layer(shape.num_experts, shape.hidden, shape.inter, gen, device)
    say(CheckRow.HEADER)
    rows = []
    for num_tokens in tokens:
        x = torch.randn(num_tokens, shape.hidden, generator=gen, device=device).bfloat16()
        weights, ids = random_routing(num_tokens, shape.num_experts, shape.top_k, gen, device=device)
        h = reference_intermediates(x, *layer.args()[:3], ids)
        a1, a2 = calibrated_input_scales(x, h)
        ref = nvfp4_fused_moe_reference(x, *layer.args(), weights, ids)
        out16, ms16 = timed(w4a16_op, x, *layer.args(), weights, ids)
        out4, ms4 = timed(w4a4_op, x, *layer.args(), weights, ids, a1, a2)
        emulated = w4a4.nvfp4_fused_moe_w4a4_emulated(x, *layer.args(), weights, ids, a1, a2)
        eb = activation_error_bound(x, a1, h, a2)
        w4a16_rel = rel_errors(out16.double() - ref, ref)[0]
        rms, worst = rel_errors(out4.double() - ref, ref)
        emu_rms, emu_max = rel_errors(out4.double() - emulated.double(), emulated.double())
        finite = bool(torch.isfinite(out4).all()) and bool(torch.isfinite(out16).all())
        row = CheckRow(
            num_tokens, num_tokens * shape.top_k / shape.num_experts, w4a16_rel, rms, worst, eb.bound, emu_rms,
            ms16, ms4, _row_problems(w4a16_rel, rms, worst, eb, emu_rms, emu_max, finite),
        )  # fmt: skip
        rows.append(row)
        say(row.line())
    return SelfCheckResult(tuple(rows))


# ---------------------------------------------------------------------------------------------
# The command (``sglang_glm5.cli`` dispatches here for ``selfcheck --path w4a4``).

SELFCHECK_TOKENS = (7, 256, 2048)  # on glm5-ep8: 1.75 (decode), 64 and 512 tokens per expert (prefill)


def _say_not_sm12x(command: str, got: str) -> int:
    print(f"sglang-glm5 {command} --path w4a4: needs an SM12x GPU (RTX PRO 6000, RTX 50xx), got {got}", file=sys.stderr)
    return 2


def selfcheck_command(args) -> int:
    """``sglang-glm5 selfcheck --path w4a4``: exit 0 on a pass, 1 on a failure, 2 off SM12x. It records
    nothing: path='auto' takes W4A4 after a passing ``tune --path w4a4``, which runs this check itself."""
    import os

    from sglang_glm5.hardware import w4a4_problem
    from sglang_glm5.shapes import parse_shape

    device = torch.device("cuda")
    got = "--device cpu" if args.device == "cpu" else w4a4_problem(device)
    if got is not None:
        return _say_not_sm12x("selfcheck", got)
    shape = parse_shape(args.shape or "glm5-ep8")
    tokens = list(args.tokens or SELFCHECK_TOKENS)
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    print(f"selfcheck --path w4a4: {shape} on {torch.cuda.get_device_name(device)}, seed {seed}")
    result = run_selfcheck(shape, tokens, device, gen)
    print(f"selfcheck: W4A4 {'passed' if result.passed else 'FAILED'}")
    return 0 if result.passed else 1
