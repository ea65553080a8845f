"""``sglang-glm5 tune --path w4a4``: W4A4's search space and benchmarks, and the tokens per expert from
which W4A4 beats W4A16.

The tuner is ``tuner.tune`` over the W4A4 record (``variants.w4a4``): pruning by W4A4's shared-memory
model and then by Triton's AOT compile for the target before any benchmark. On an SM12x GPU of the
target's kind it benchmarks the feasible tiles (``kernel_bencher``); ``after_tune``
then times the whole W4A4 op against W4A16 per bucket, checks W4A4 with the picked tiles against the
float64 reference from the threshold up, and only on a pass stores the threshold
(``threshold_from_timings``) that ``w4a4_select.resolve_path("auto")`` reads. Offline it stores
AOT-checked heuristic tiles, marked ``measured: false``, and no threshold.
Nothing here has run on SM120 hardware.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from sglang_glm5 import autotune, nvfp4, w4a4
from sglang_glm5.hardware import GpuTarget
from sglang_glm5.tiles import GemmConfig, MoeConfig
from sglang_glm5.variants import w4a4 as family

# ---------------------------------------------------------------------------------------------
# The tuner.


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
    layers = rotating_layers(shape, gen, w4a4=True)  # the W4A4 kernels read the checkpoint's layout
    copies = len(layers)
    inputs: dict[int, tuple] = {}

    def bench(kernel: str, cfg: GemmConfig, bucket: int) -> float:
        if bucket not in inputs:
            weights, ids, tokens = balanced_routing(shape, max(bucket, shape.top_k), gen)
            x = torch.randn(tokens, shape.hidden, generator=gen, device="cuda").bfloat16()
            a1 = (x.float().abs().max() / 2688.0).reshape(1)
            xq, xs = family.quantize_activations(x, a1)
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
                family.launch_gemm1(
                    xq, xs, a1, layer.w13, layer.w13_scale, layer.w13_scale_2, a2, route, hq_out, hs_out, cfg,
                    shape.top_k, 0, shape.inter, False,
                )  # fmt: skip
            else:
                y = torch.empty(ids.numel(), shape.hidden, dtype=torch.bfloat16, device="cuda")
                family.launch_gemm2(
                    hq, hs, a2, layer.w2, layer.w2_scale, layer.w2_scale_2, weights, route, y, cfg, False, False
                )  # fmt: skip

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
    one token count per bucket, each run with its bucket's tiles); True when a row failed."""
    import math

    from sglang_glm5.w4a4_verify import run_selfcheck

    bucket_of_tokens = {math.ceil(b * shape.num_experts / shape.top_k): b for b in buckets}

    def op(x, *args):  # args: the layer, topk weights, topk ids, the input scales
        return w4a4.nvfp4_fused_moe_w4a4(x, *args, config=picked[bucket_of_tokens[x.shape[0]]])

    tokens = list(bucket_of_tokens)
    gen = torch.Generator(device="cuda")
    gen.manual_seed(seed)
    print(f"\ntune: checking W4A4 against float64 at T = {', '.join(map(str, tokens))}")
    return not run_selfcheck(shape, tokens, torch.device("cuda"), gen, w4a4_op=op).passed


# ---------------------------------------------------------------------------------------------
# What `tune --path w4a4` does after storing the tiles.


def after_tune(target: GpuTarget, shape, entries: dict, buckets: list, seed: int, out: Path, measure: bool) -> int:
    """On the GPU (``measure``): time the whole W4A4 op against W4A16 with the picked tiles, find the
    threshold, check W4A4 with each tuned bucket's tiles against float64, and store the threshold with the
    checked buckets only on a pass. A failure removes any threshold stored before for this GPU and shape
    (the tiles just stored replaced the ones it was checked with) and gives exit code 1. Offline: no
    threshold, so path='auto' stays on W4A16 until this runs on the GPU."""
    if not measure:
        print(f"\ntune: {shape}: no threshold (not measured): path='auto' takes W4A4 only after this command "
              "ran on the GPU that serves")  # fmt: skip
        return 0
    variant = family.VARIANT
    picked = {}
    for b in buckets:
        keys = [autotune.cache_key(target, k, autotune.gemm_shape(k, shape), b, measured=True, variant=variant)
                for k in variant.kernels]  # fmt: skip
        picked[b] = MoeConfig(*(entries[key].config for key in keys))
    timings = {}
    run = op_bencher(shape, seed)
    for bucket in buckets:
        timings[bucket] = run(bucket, picked[bucket])
        print(f"\ntune: m={bucket}: W4A16 {timings[bucket][0]:.3f} ms, W4A4 {timings[bucket][1]:.3f} ms")
    threshold = threshold_from_timings(timings)
    if threshold is None:
        w4a4.store_threshold(out, target, shape, None, timings, checked=[])
        print(f"\ntune: {shape}: W4A4 never faster here; path='auto' stays on W4A16 -> {out}")
        return 0
    if check_tiles(shape, picked, list(buckets), seed):
        w4a4.remove_threshold(out, target, shape)
        print(f"\ntune: {shape}: W4A4 FAILED its check against the float64 reference; no threshold stored (an "
              "earlier one removed), path='auto' stays on W4A16")  # fmt: skip
        return 1
    w4a4.store_threshold(out, target, shape, threshold, timings, checked=list(buckets))
    print(f"\ntune: {shape}: W4A4 checked against float64; auto picks it from {threshold} tokens per expert "
          f"(measured) -> {out}")  # fmt: skip
    return 0
