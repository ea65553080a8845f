"""``sglang-glm5 quickstart``: the package doing its job on this machine, the first command a user runs.

Without a GPU (about a minute on 2 cores): the W4A16 op on a small GLM-5-like layer through the Triton interpreter
against the float64 reference (``selfcheck``), the tiles the op reads for the default target (RTX PRO 6000: the
shipped cache and the heuristic's) compiled ahead of time for its architecture and checked against its shared memory
and the op's decode check, and the default profile's plan in a few lines. On a GPU: the op on a GLM-5 layer on that
GPU, the tiles for that GPU, the plan, then ``tune --target local`` (measured) when no measured cache entry exists
for it. The last line says what passed and what to run next. Nothing heavy is imported at module level.
"""

from __future__ import annotations

import argparse
import os
import time
from concurrent.futures import ThreadPoolExecutor

DEFAULT_TARGET = "rtx-pro-6000"  # the tiles checked without a GPU: the package's first target


def add_cli(subparsers) -> None:
    from sglang_glm5.profiles import profile_help

    p = subparsers.add_parser(
        "quickstart",
        help="the first command: the op against float64, the tiles, the plan on this machine (and tune on a GPU)",
        description="Without a GPU (about a minute): the op through the Triton interpreter against the float64 "
        "reference, the RTX PRO 6000 tiles compiled ahead of time for sm_120 (shared memory, decode check), and the "
        "default profile's plan. On a GPU: the same on it, then `tune --target local` when no measured cache entry "
        "exists for it. Ends with one line: what passed and what to run next. Exit status 1 when a check fails.",
    )
    p.add_argument("--profile", default=None, help=profile_help() + "; default: the shipped profile for this GPU")
    p.add_argument("--no-tune", action="store_true", help="on a GPU: do not tune it, even without measured entries")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    from sglang_glm5._files import check_cache_dir

    check_cache_dir()  # one line now rather than a traceback after the compiles
    import torch

    gpu = torch.cuda.is_available()
    if not gpu:
        os.environ["TRITON_INTERPRET"] = "1"  # before the first kernel import (target_tiles imports the kernels)
    import triton

    from sglang_glm5 import doctor, hardware
    from sglang_glm5.cli import version

    target = hardware.detect() if gpu else hardware.resolve(DEFAULT_TARGET)
    where = torch.cuda.get_device_name() if gpu else "a machine without a CUDA GPU"
    print(f"quickstart: sglang-glm5 {version()} on {where} (torch {torch.__version__}, Triton {triton.__version__})")
    tiles = doctor.target_tiles(target)
    print(f"[1/3] tiles: compiling the {len(tiles)} W4A16 tiles the op may launch on {target.name} for {target.sm}, "
          "in worker processes beside the op (memoized in the user cache)", flush=True)  # fmt: skip
    with ThreadPoolExecutor(1) as pool:  # the compiles run in subprocesses while the op runs here
        compiled = pool.submit(doctor.check_target_tiles, target, tiles)
        print("[2/3] op: " + ("on this GPU" if gpu else "through the Triton interpreter on the CPU"), flush=True)
        op_ok = _op(gpu) == 0
        tiles_status, tiles_line = compiled.result()
    print(f"[{tiles_status:>4}] {tiles_line}")
    print("[3/3] plan:", flush=True)
    profile = args.profile or default_profile(target.name if gpu else None)
    plan_line = _plan(profile)
    tiles_ok = tiles_status == doctor.OK
    passed = [
        ("the op against float64 " + (f"on the {target.name}" if gpu else "through the interpreter"), op_ok),
        (f"{len(tiles)} {target.name} tiles within {target.shared_per_block} B", tiles_ok),
        (plan_line, plan_line is not None),
    ]
    failed = [what or f"plan {profile}" for what, ok in passed if not ok]
    tuned = ""
    if gpu and not failed:
        tune_ok, tuned = _tune_if_unmeasured(target, args.no_tune)
        if not tune_ok:
            failed.append(f"tune --target local on the {target.name}")
    elapsed = time.perf_counter() - t0
    if failed:
        print(f"quickstart: FAILED: {'; '.join(failed)} ({elapsed:.0f} s); the lines above say why")
        return 1
    if gpu:
        nxt = "next: `sglang-glm5 doctor`, then `scripts/launch_server.sh MODEL` (README: Serving)"
    else:
        nxt = 'next, on the GPU box: pip install ".[sglang]" && sglang-glm5 quickstart (runs it there and tunes)'
    print(f"quickstart: passed in {elapsed:.0f} s: {', '.join(what for what, _ in passed)}{tuned}; {nxt}")
    return 0


def default_profile(gpu: str | None) -> str:
    """The first shipped profile written for this GPU (a ``hardware.TARGETS`` name), else the package's default."""
    from sglang_glm5.profiles import DEFAULT_PROFILE, load_profile, profile_names

    mine = [name for name in profile_names() if gpu and load_profile(name).gpu == gpu]
    return DEFAULT_PROFILE if not mine or DEFAULT_PROFILE in mine else mine[0]


def _op(gpu: bool) -> int:
    """selfcheck's W4A16 run: a GLM-5 layer under EP8 on a GPU, the small GLM-5-like layer through the interpreter."""
    from sglang_glm5.cli import selfcheck_command

    args = argparse.Namespace(device="cuda" if gpu else "cpu", shape=None, tokens=None, seed=None, path="w4a16")
    return selfcheck_command(args)


def _plan(profile_name: str) -> str | None:
    """The profile's plan in a few lines; its one-line summary, or None when it does not fit (the reason printed)."""
    from sglang_glm5.plan import PlanError, load_model_config, make_plan
    from sglang_glm5.profiles import load_profile

    profile = load_profile(profile_name)
    model, name = load_model_config(None)
    try:
        plan = make_plan(profile, model, model_name=name)
    except PlanError as e:
        print(f"  {profile.name}: {e}")
        return None
    lay, gib = plan.layout, 2**30
    print(f"  {name} under {profile.name}: {profile.description}")
    print(f"  {profile.num_gpus} GPUs, tp {lay.tp}, ep {lay.ep}, attn-dp {lay.attn_dp}, MoE backend {lay.backend}; "
          f"weights {plan.weights / gib:.1f} GiB per GPU, KV cache {plan.kv_pool / gib:.1f} GiB")  # fmt: skip
    print(f"  fits {plan.tokens_total:,} tokens of KV, {plan.requests_at_context} requests of {plan.context:,} "
          f"tokens; every line and flag: sglang-glm5 plan --profile {profile.name}")  # fmt: skip
    return f"the {profile.name} plan fits ({plan.tokens_total:,} KV tokens)"


def _tune_if_unmeasured(target, no_tune: bool) -> tuple[bool, str]:
    """On the GPU: ``tune --target local`` when the cache holds no measured entry for it (its own, or a sibling's with
    the same SMs and shared memory); whether it passed, and what happened for the last line."""
    from sglang_glm5 import autotune

    cache = autotune.ConfigCache(target)
    measured_owners = tuple(o + "|" for o in cache.owners[:-1])  # the last owner: the architecture's unmeasured
    measured = sum(key.startswith(measured_owners) for key in cache.entries)
    if measured:
        return True, f", {measured} measured cache entries for it"
    if no_tune:
        return True, ", no measured entry for it (--no-tune; `sglang-glm5 tune --target local` measures them)"
    from sglang_glm5.cli import build_parser

    print(f"quickstart: no measured tile entry for {target.name}: tuning it (sglang-glm5 tune --target local)",
          flush=True)  # fmt: skip
    tune_args = build_parser().parse_args(["tune", "--target", "local"])
    if tune_args.func(tune_args) != 0:
        return False, ""
    return True, f", its tiles tuned and measured ({autotune.user_cache_path(target)})"
