"""``sglang-glm5 tune --path w4a4``: W4A4 tiles and the tokens per expert from which W4A4 beats W4A16.

The W4A16 tuner's machinery (``sglang_glm5.autotune``: Entry, TuneReport, the cache file and store(),
pruning by a shared-memory model and then by Triton's AOT compile for the target before any benchmark),
with W4A4's own kernels, search space (``search_space``) and shared-memory model
(``w4a4.model_shared_bytes``). On an SM12x GPU of the target's kind it benchmarks the feasible tiles,
then times the whole W4A4 op against W4A16 per bucket, checks W4A4 with the picked tiles against the
float64 reference from the threshold up, and only on a pass stores the threshold
(``threshold_from_timings``) that ``w4a4_select.resolve_path("auto")`` reads. Offline it stores
AOT-checked heuristic tiles, marked ``measured: false``, and no threshold.
Nothing here has run on SM120 hardware.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

import torch

from sglang_glm5 import autotune, nvfp4, w4a4
from sglang_glm5.autotune import Bench, Entry, TuneReport
from sglang_glm5.hardware import GpuTarget, runs_w4a4
from sglang_glm5.shapes import MoeShape
from sglang_glm5.tiles import GemmConfig, MoeConfig

TUNE_BUCKETS = (16, 32, 64, 128, 256, 512, 1024, 2048)  # tokens per expert; W4A4 is for prefill


# ---------------------------------------------------------------------------------------------
# The tuner.


def _require_sm12x(target: GpuTarget) -> None:
    if not runs_w4a4(target.arch):
        raise ValueError(f"W4A4 runs only on SM12x targets (rtx-pro-6000, sm120, ...), got {target.name} ({target.sm})")


def search_space(bucket: int) -> list[GemmConfig]:
    """W4A4 candidates: prefill tiles; block_k 128 or 256 = two or four m16n8k64 FP4 mma steps."""
    block_ms = (32, 64) if bucket <= 64 else (64, 128)
    return [
        GemmConfig(bm, bn, bk, warps, stages)
        for bm, bn, bk, stages, warps in itertools.product(block_ms, (64, 128), (128, 256), (2, 3, 4), (4, 8))
    ]


def _w4a4_fits(kernel: str, cfg: GemmConfig, target: GpuTarget) -> int | None:
    """Compiled shared bytes when the config fits the target by the model and by the compiler, else None."""
    if not target.fits(w4a4.model_shared_bytes(kernel, cfg)):
        return None
    (shared,) = w4a4.compiled_shared_bytes_many([(kernel, cfg)], target.arch)
    return shared if isinstance(shared, int) and target.fits(shared) else None


def feasible_candidates(
    kernel: str, bucket: int, target: GpuTarget, report: TuneReport
) -> list[tuple[GemmConfig, int]]:
    """W4A4 candidates that fit the target: pruned by the model first, then by the AOT compile (or its error)."""
    return autotune.prune(
        search_space(bucket), target, report,
        lambda cfg: w4a4.model_shared_bytes(kernel, cfg),
        lambda configs: w4a4.compiled_shared_bytes_many([(kernel, cfg) for cfg in configs], target.arch),
        verdicts=report.verdicts_for(kernel),
    )  # fmt: skip


def tune(
    target: GpuTarget,
    shape: MoeShape,
    buckets: Iterable[int],
    bench: Bench | None,
    *,
    progress: Callable[[str], None] | None = None,
    survey: bool = False,
) -> tuple[dict[str, Entry], TuneReport]:
    """``autotune.run_tuner`` for the W4A4 kernels (SM12x targets only). A candidate that fails to compile
    or launch on the GPU (never run on SM120 before) is skipped and counted, not fatal."""
    _require_sm12x(target)
    space = autotune.TuneSpace(
        name="W4A4 ",
        kernels=w4a4.KERNELS,
        key=lambda kernel, bucket, measured: w4a4.cache_key(target, kernel, shape, bucket, measured=measured),
        heuristic=w4a4.heuristic_config,
        search_space=search_space,
        fits=lambda kernel, cfg: _w4a4_fits(kernel, cfg, target),
        feasible=lambda kernel, bucket, report: feasible_candidates(kernel, bucket, target, report),
    )
    return autotune.run_tuner(space, target, buckets, bench, progress, survey=survey)


def threshold_from_timings(timings: dict[int, tuple[float, float]]) -> int | None:
    """{bucket: (W4A16 ms, W4A4 ms)} -> the smallest bucket from which W4A4 is faster at it and at every
    larger bucket measured; None when W4A4 loses at the largest."""
    found = None
    for bucket in sorted(timings, reverse=True):
        w4a16_ms, w4a4_ms = timings[bucket]
        if not w4a4_ms < w4a16_ms:
            break
        found = bucket
    return found


# ---------------------------------------------------------------------------------------------
# Timings on an SM12x GPU (never run here: no such GPU).


def kernel_bencher(shape, seed: int) -> Callable[[str, GemmConfig, int], float]:
    """A tuner ``Bench`` for the W4A4 GEMMs: median ms of one gemm1 or gemm2 launch.

    Balanced routing (every local expert gets the bucket's tokens), activations quantized once per
    bucket; weights rotate over enough layer copies to exceed twice the L2 cache, as in
    ``bench.kernel_bencher``. Values do not change the kernels' time.
    """
    import triton.testing

    from sglang_glm5.bench import balanced_routing, rotating_layers
    from sglang_glm5.routing import align_pairs_by_expert

    gen = torch.Generator(device="cuda")
    gen.manual_seed(seed)
    layers = rotating_layers(shape, gen)
    copies = len(layers)
    inputs: dict[int, tuple] = {}

    def bench(kernel: str, cfg: GemmConfig, bucket: int) -> float:
        if bucket not in inputs:
            weights, ids, tokens = balanced_routing(shape, max(bucket, shape.top_k), gen)
            x = torch.randn(tokens, shape.hidden, generator=gen, device="cuda").bfloat16()
            a1 = (x.float().abs().max() / 2688.0).reshape(1)
            xq, xs = w4a4.quantize_activations(x, a1)
            h = nvfp4.quantize(torch.randn(ids.numel(), shape.inter, generator=gen, device="cuda"))
            a2 = h.global_scale.float().reshape(1).expand(shape.num_experts).contiguous()
            inputs[bucket] = (xq, xs, a1, h.packed, h.scale.view(torch.uint8), a2, weights.reshape(-1), ids)
        xq, xs, a1, hq, hs, a2, weights, ids = inputs[bucket]
        route = align_pairs_by_expert(ids, shape.num_experts, cfg.block_m)
        turn = iter(range(1 << 62))

        def launch():
            layer = layers[next(turn) % copies]
            if kernel == "gemm1":
                hq_out, hs_out = torch.empty_like(hq), torch.empty_like(hs)
                w4a4.launch_gemm1(xq, xs, a1, layer.w13, layer.w13_scale, layer.w13_scale_2, a2, route, hq_out, hs_out,
                                  cfg, shape.top_k, 0, shape.inter, False)  # fmt: skip
            else:
                y = torch.empty(ids.numel(), shape.hidden, dtype=torch.bfloat16, device="cuda")
                w4a4.launch_gemm2(hq, hs, a2, layer.w2, layer.w2_scale, layer.w2_scale_2, weights, route, y, cfg,
                                  False, False)  # fmt: skip

        return triton.testing.do_bench(launch, warmup=5, rep=30, return_mode="median")

    return bench


def op_bencher(shape, seed: int) -> Callable[[int, MoeConfig | None], tuple[float, float]]:
    """(W4A16 ms, W4A4 ms) of the whole op at m tokens per expert (balanced routing): the threshold's data."""
    import triton.testing

    from sglang_glm5.bench import balanced_routing
    from sglang_glm5.moe import nvfp4_fused_moe
    from sglang_glm5.testing import random_layer
    from sglang_glm5.w4a4_verify import w4a16_kwargs

    gen = torch.Generator(device="cuda")
    gen.manual_seed(seed)
    layer = random_layer(shape.num_experts, shape.hidden, shape.inter, gen, "cuda")
    pin = w4a16_kwargs()

    def bench(m: int, config: MoeConfig | None) -> tuple[float, float]:
        weights, ids, tokens = balanced_routing(shape, m, gen)
        x = torch.randn(tokens, shape.hidden, generator=gen, device="cuda").bfloat16()
        a1 = torch.full((shape.num_experts, 2), float(x.float().abs().max()) / 2688.0, device="cuda")
        a2 = torch.full((shape.num_experts,), 1.0 / 2688.0, device="cuda")  # values do not change the time
        args = (x, *layer.args(), weights, ids)
        # Both as the SGLang plugin calls them: no host-side id check.
        t16 = triton.testing.do_bench(
            lambda: nvfp4_fused_moe(*args, **pin, check_ids=False), warmup=10, rep=100, return_mode="median"
        )
        t4 = triton.testing.do_bench(
            lambda: w4a4.nvfp4_fused_moe_w4a4(*args, a1, a2, config=config, check_ids=False),
            warmup=10, rep=100, return_mode="median",
        )  # fmt: skip
        return t16, t4

    return bench


def check_tiles(shape, picked: dict[int, MoeConfig], buckets: list[int], seed: int) -> bool:
    """W4A4 with the picked tiles against the float64 reference at each bucket (``w4a4_verify.run_selfcheck``,
    one token count per bucket); True when a row failed."""
    import math

    from sglang_glm5.autotune import m_bucket
    from sglang_glm5.w4a4_verify import run_selfcheck

    def op(x, *args):
        tokens_per_expert = args[-3].numel() / shape.num_experts  # args: layer, topk weights, ids, a1, a2
        return w4a4.nvfp4_fused_moe_w4a4(x, *args, config=picked[m_bucket(tokens_per_expert)])

    tokens = [math.ceil(b * shape.num_experts / shape.top_k) for b in buckets]
    gen = torch.Generator(device="cuda")
    gen.manual_seed(seed)
    print(f"\ntune: checking W4A4 against float64 at T = {', '.join(map(str, tokens))}")
    return not run_selfcheck(shape, tokens, torch.device("cuda"), gen, w4a4_op=op).passed


# ---------------------------------------------------------------------------------------------
# The command.


def _not_sm12x(got: str) -> int:
    print(f"sglang-glm5 tune --path w4a4: needs an SM12x GPU (RTX PRO 6000, RTX 50xx), got {got}", file=sys.stderr)
    return 2


def tune_command(args) -> int:
    """``sglang-glm5 tune --path w4a4``: W4A4 tiles and the W4A4-over-W4A16 threshold, into the user cache
    (or --out). On a local GPU of the target's kind: measured tiles, the threshold from timing both ops,
    stored only when W4A4 with those tiles passes its check against float64 (exit 1 otherwise). Offline:
    AOT-checked heuristic tiles, marked measured: false, and no threshold. Exit 2 for a non-SM12x target
    or --target local off SM12x."""
    import os

    from sglang_glm5.hardware import detect, resolve, w4a4_problem
    from sglang_glm5.shapes import parse_shape
    from sglang_glm5.w4a4_select import clear_memo

    local_problem = w4a4_problem(torch.device("cuda"))
    if args.target == "local" and local_problem is not None:
        return _not_sm12x(local_problem)
    target = resolve(args.target)
    if not runs_w4a4(target.arch):
        return _not_sm12x(f"target {target.name} ({target.sm})")
    shapes = [parse_shape(s) for s in args.shape]
    local = detect() if local_problem is None else None
    measure = local is not None and local.name == target.name and local.arch == target.arch
    out = Path(args.out) if args.out else autotune.user_cache_path(target)
    buckets = list(args.batch_sizes or TUNE_BUCKETS)
    mode = "measuring on this GPU" if measure else "offline (no GPU of this kind here): AOT-checked picks, not measured"
    print(f"tune --path w4a4: {target.name} ({target.sm}, {target.shared_per_block} B shared per block), {mode}")
    seed = int.from_bytes(os.urandom(4), "little")
    total = TuneReport()
    rc = 0
    for shape in shapes:
        entries, report = tune(
            target, shape, buckets, kernel_bencher(shape, seed) if measure else None, progress=autotune.print_progress,
            survey=not args.no_survey,
        )  # fmt: skip
        autotune.store(out, target, entries)
        total.add(report)
        if not measure:
            print(f"\ntune: {shape}: {len(entries)} W4A4 entries (not measured) -> {out}; no threshold: path='auto' "
                  "takes W4A4 only after this command ran on the GPU that serves")  # fmt: skip
            continue
        picked = {b: MoeConfig(*(entries[w4a4.cache_key(target, k, shape, b, measured=True)].config
                                 for k in w4a4.KERNELS)) for b in buckets}  # fmt: skip
        timings = {}
        run = op_bencher(shape, seed)
        for bucket in buckets:
            timings[bucket] = run(bucket, picked[bucket])
            print(f"\ntune: m={bucket}: W4A16 {timings[bucket][0]:.3f} ms, W4A4 {timings[bucket][1]:.3f} ms")
        threshold = threshold_from_timings(timings)
        if threshold is None:
            w4a4.store_threshold(out, target, shape, None, timings)
            print(f"\ntune: {shape}: W4A4 never faster here; path='auto' stays on W4A16 -> {out}")
            continue
        failed = check_tiles(shape, picked, [b for b in buckets if b >= threshold], seed)
        if failed:
            print(f"\ntune: {shape}: W4A4 FAILED its check against the float64 reference; no threshold stored, "
                  "path='auto' stays on W4A16")  # fmt: skip
            rc = 1
            continue
        w4a4.store_threshold(out, target, shape, threshold, timings)
        print(f"\ntune: {shape}: {len(entries)} W4A4 entries; checked against float64; auto picks W4A4 from "
              f"{threshold} tokens per expert (measured) -> {out}")  # fmt: skip
    for line in total.space_lines(target, "W4A4 "):
        print(f"tune: {line}")
    if measure:
        print(f"tune: {total.summary()}")
    clear_memo()
    return rc
