"""Experiment: what one eager call of the op spends on the host, piece by piece, in isolation.

``host_split.py`` times each function of a call inside the call. Here each piece is re-issued alone, many times, on
the arguments one real call gave it (EP8 and TP8 at EXP_BATCHES, default 1,64; the GPU idle at the start of each
timing, no synchronization inside, so the launch queue absorbs the launches): microseconds per piece (median of
ROUNDS rounds of REPS calls each).

- each wrapper the op calls (``route_pairs``, ``launch_gemm1``, ``launch_gemm2``, ``sum_over_slots``) on its recorded
  arguments, and the op's own planning (``pick_config``, ``plan_gemms``, ``uses_pdl``, ``w4a16_gluon.applies``);
- each Triton launch those make, three ways: ``kernel[grid](...)`` as the wrappers launch (``JITFunction.run``), the
  binder alone (its per-argument specialization, the part a launch pays before the driver), and the compiled
  kernel's own launcher with the bound arguments (the driver's launch, what no Python around it can go under);
- small torch calls the wrappers make (a small CUDA ``torch.empty``, ``view``, ``stride``, ``current_stream``).

Usage: python bench/exp/launch_parts.py OUT_DIR
"""

import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
from decode_cases import cases, generator, op_calls
from triton.runtime.jit import JITFunction

from sglang_glm5 import autotune, env, routing
from sglang_glm5.bench import environment
from sglang_glm5.hardware import device_arch
from sglang_glm5.variants import w4a16, w4a16_gluon, w4a16_plan

BATCHES = tuple(int(b) for b in os.environ.get("EXP_BATCHES", "1,64").split(","))
REPS = 50
ROUNDS = 5
WRAPPERS = ("route_pairs", "launch_gemm1", "launch_gemm2", "sum_over_slots")


def per_call_us(fn, reps: int = REPS) -> float:
    """Median over ROUNDS of the host microseconds per call of ``fn`` (``reps`` calls a round)."""
    rounds = []
    for _ in range(ROUNDS):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(reps):
            fn()
        rounds.append((time.perf_counter() - start) * 1e6 / reps)
    torch.cuda.synchronize()
    return statistics.median(rounds)


def record(calls):
    """One op call's wrapper calls and Triton launches: [(wrapper, args, kwargs)], [(kernel, grid, args, kwargs)]."""
    wrapped, launches = [], []
    saved = {name: getattr(w4a16, name) for name in WRAPPERS}
    run = JITFunction.run

    def recorder(name):
        def call(*args, **kwargs):
            wrapped.append((name, args, kwargs))
            return saved[name](*args, **kwargs)

        return call

    def launch(self, *args, grid, warmup, **kwargs):
        launches.append((self, grid, args, kwargs))
        return run(self, *args, grid=grid, warmup=warmup, **kwargs)

    for name in WRAPPERS:
        setattr(w4a16, name, recorder(name))
    JITFunction.run = launch
    try:
        calls()
    finally:
        JITFunction.run = run
        for name, fn in saved.items():
            setattr(w4a16, name, fn)
    torch.cuda.synchronize()
    return wrapped, launches


def launch_ways(kernel, grid, args, kwargs) -> dict[str, float]:
    """Host us of one launch through ``JITFunction.run``, its binder alone, and the compiled kernel's launcher."""
    out = {"jit": per_call_us(lambda: kernel[grid](*args, **kwargs))}
    device = torch.cuda.current_device()
    try:
        binder = kernel.device_caches[device][-1]
        full = dict(kwargs, debug=kwargs.get("debug", kernel.debug), instrumentation_mode="")
        try:
            bound, _, _ = binder(*args, **full)
        except TypeError:
            full.pop("instrumentation_mode")
            bound, _, _ = binder(*args, **full)
        out["binder"] = per_call_us(lambda: binder(*args, **full))
        compiled = kernel[grid](*args, **kwargs)
        values = tuple(bound.values())
        stream = torch.cuda.current_stream().cuda_stream
        grid3 = (*grid, 1, 1)[:3]

        def direct():
            compiled.run(*grid3, stream, compiled.function, compiled.packed_metadata, None, None, None, *values)

        out["launcher"] = per_call_us(direct)
    except Exception as e:  # noqa: BLE001 - another Triton's internals: report, keep going
        out["error"] = f"{type(e).__name__}: {e}"
    return out


def planning_us(layout, batch: int, weight_layout: str, dev: torch.device) -> dict[str, float]:
    """Host us of the op's planning calls for B = ``batch`` on ``layout``."""
    tpe = batch * 8 / 256
    shape = (layout.num_experts, layout.hidden, layout.inter)
    cfg = autotune.pick_config("w4a16", tpe, *shape, dev)
    sms = w4a16_plan.sm_count(dev.index)
    return {
        "pick_config": per_call_us(lambda: autotune.pick_config("w4a16", tpe, *shape, dev)),
        "plan_gemms": per_call_us(lambda: w4a16_plan.plan_gemms(cfg, batch * 8, shape[0], 256, *shape[1:], sms)),
        "gluon applies": per_call_us(
            lambda: w4a16_gluon.applies(dev, weight_layout, layout.hidden, cfg.gemm1, torch.bfloat16)
        ),
    }


def main(out: Path) -> None:
    gen = generator(43)
    rows = []
    dev = torch.device("cuda", torch.cuda.current_device())
    small = torch.empty(64, device=dev, dtype=torch.uint8)
    micro = {
        "torch.empty 16 int32": lambda: torch.empty(16, dtype=torch.int32, device=dev),
        "view(int16)": lambda: small.view(torch.int16),
        "stride(0)": lambda: small.stride(0),
        "current_stream": lambda: torch.cuda.current_stream(dev),
        "cuda.is_available": torch.cuda.is_available,
        "device_arch": lambda: device_arch(dev),
        "env.get(PDL)": lambda: env.get(env.PDL),
        "uses_pdl": lambda: routing.uses_pdl(dev),
        "interpreting": routing.interpreting,
    }
    micro_us = {k: per_call_us(f, 2000) for k, f in micro.items()}
    print("micro (us a call): " + ", ".join(f"{k} {v:.2f}" for k, v in micro_us.items()), flush=True)
    for name, layout, bundles, batch, inputs in cases(gen, BATCHES):
        calls = op_calls(inputs[:1], bundles[:1])
        calls()
        torch.cuda.synchronize()
        whole = per_call_us(calls)
        wrapped, launches = record(calls)
        planning = planning_us(layout, batch, bundles[0].layout, dev)
        wrappers = [
            {"wrapper": n, "us": per_call_us(lambda n=n, a=a, k=k: getattr(w4a16, n)(*a, **k))} for n, a, k in wrapped
        ]
        kernels = [{"kernel": k.fn.__name__, **launch_ways(k, g, a, kw)} for k, g, a, kw in launches]
        row = {"layout": name, "B": batch, "op_us": whole, "planning_us": planning, "wrappers": wrappers,
               "launches": kernels}  # fmt: skip
        rows.append(row)
        print(f"{name} B={batch}: op {whole:.0f} us a call; " + ", ".join(f"{k} {v:.1f}" for k, v in planning.items()))
        for w in wrappers:
            print(f"  {w['wrapper']}: {w['us']:.1f} us", flush=True)
        for k in kernels:
            parts = ", ".join(f"{x} {v:.1f}" if isinstance(v, float) else f"{x} {v}" for x, v in k.items()
                              if x != "kernel")  # fmt: skip
            print(f"  launch {k['kernel']}: {parts}", flush=True)
        torch.cuda.empty_cache()
    (out / "launch_parts.json").write_text(json.dumps({"env": environment(), "micro_us": micro_us, "rows": rows},
                                                      indent=1))  # fmt: skip


if __name__ == "__main__":
    main(Path(sys.argv[1]))
