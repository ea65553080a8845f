"""Command line: ``sglang-glm5 <command>``.

Each command lives in a module that exposes ``add_cli(subparsers)``; that module imports nothing heavy
(torch, triton, sglang) at module level, so ``--help`` stays fast and works without a GPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import importlib
import os
import sys
import time

DEFAULT_M = (1, 2, 4, 8, 16, 32, 64, 128, 512, 2048)  # tokens per expert in `bench --routing balanced`
REAL_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 2048, 8192)  # tokens per step in `bench --routing real`
SELFCHECK_TOKENS = (1, 7, 64)  # `selfcheck` (W4A16); --path w4a4 has its own (w4a4_verify.SELFCHECK_TOKENS)
PATH_HELP = (
    "w4a16 (default): NVFP4 weights, 16-bit activations, any SM80+ GPU; w4a4: SM12x only, activations "
    "quantized to NVFP4 with the checkpoint's input scales for the block-scaled FP4 tensor cores (prefill); "
    "dense: sm_90 / sm_100, the weights dequantized once to bf16 and torch grouped GEMMs (prefill, no tiles)"
)

# Modules that add their own subcommands (each exposes add_cli(subparsers)).
_COMMAND_MODULES: tuple[str, ...] = (
    "sglang_glm5.loadtest.cli",
    "sglang_glm5.doctor",
    "sglang_glm5.plan",
    "sglang_glm5.predict_report",  # the step model's options on `plan`: after it
    "sglang_glm5.router",
    "sglang_glm5.serve",
    "sglang_glm5.stock_configs",
)


def _cmd_selfcheck(args: argparse.Namespace) -> int:
    """Run the op on a GLM-5-shaped layer and compare it with the float64 reference: the family's check."""
    if args.path == "w4a16" and (args.device == "cpu" or (args.device == "auto" and not _cuda_available())):
        # Before the first kernel import (reading the family's record imports its kernels): Triton reads
        # TRITON_INTERPRET when a kernel is defined.
        os.environ["TRITON_INTERPRET"] = "1"
    from sglang_glm5 import variants

    return variants.resolve(variants.get(args.path).selfcheck)(args)


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def selfcheck_command(args: argparse.Namespace) -> int:
    """``selfcheck --path w4a16 | dense``: the op on that path against the float64 reference."""
    import torch

    use_gpu = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    if args.device == "cuda" and not torch.cuda.is_available():
        print("selfcheck: --device cuda but torch sees no CUDA device", file=sys.stderr)
        return 2
    if args.path == "dense":
        from sglang_glm5.prefill import available

        if not use_gpu or not available(torch.device("cuda")):
            print("selfcheck --path dense: needs a GPU with a native torch._grouped_mm (sm_90 / sm_100)",
                  file=sys.stderr)  # fmt: skip
            return 2
    if not use_gpu:
        os.environ["TRITON_INTERPRET"] = "1"  # must precede the first kernel import
    from sglang_glm5.moe import fused_moe
    from sglang_glm5.reference import nvfp4_fused_moe_reference
    from sglang_glm5.shapes import parse_shape
    from sglang_glm5.testing import random_layer, random_routing

    shape = parse_shape(args.shape or ("glm5-ep8" if use_gpu else "glm5-mini"))
    device = torch.device("cuda" if use_gpu else "cpu")
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    mode = torch.cuda.get_device_name() if use_gpu else "CPU, Triton interpreter"
    layer = random_layer(shape.num_experts, shape.hidden, shape.inter, gen, device)
    bundle = layer.served()  # the weight layout a server would run
    print(f"selfcheck --path {args.path}: {shape} on {mode}, {bundle.layout} weight layout, seed {seed}")
    failures = 0
    for num_tokens in args.tokens or SELFCHECK_TOKENS:
        x = torch.randn(num_tokens, shape.hidden, generator=gen, device=device).bfloat16()
        weights, ids = random_routing(num_tokens, shape.num_experts, shape.top_k, gen, device=device)
        t0 = time.perf_counter()
        out = fused_moe(x, bundle, weights, ids, path=args.path)
        if use_gpu:
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - t0
        ref = nvfp4_fused_moe_reference(x, *layer.args(), weights, ids)
        rel = ((out.double() - ref).norm() / ref.norm()).item()
        ok = rel < 1e-2 and bool(torch.isfinite(out).all())
        failures += not ok
        print(f"  T={num_tokens:<5d} rel err {rel:.2e}  first call {elapsed * 1e3:8.1f} ms  {'ok' if ok else 'FAIL'}")
    print("selfcheck: " + ("passed" if not failures else f"{failures} case(s) FAILED (relative error limit 1e-2)"))
    return 1 if failures else 0


def _cmd_bench(args: argparse.Namespace) -> int:
    """Time the op against bf16 and dequantize-then-bf16 grouped GEMMs on the local GPU."""
    import torch

    if not torch.cuda.is_available():
        print("bench: needs a CUDA GPU (torch sees none)", file=sys.stderr)
        return 2
    from pathlib import Path

    from sglang_glm5 import bench
    from sglang_glm5.shapes import parse_shape

    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
    path_kwargs = {} if args.path == "auto" else {"path": args.path}
    if args.routing == "real":
        from sglang_glm5 import bench_real

        unknown = [s for s in args.shape if s not in bench_real.SHAPE_LAYOUTS]
        if unknown:
            print(f"bench: --routing real knows {', '.join(bench_real.SHAPE_LAYOUTS)}, got {unknown}", file=sys.stderr)
            return 2
        rows, numerics = [], []
        if args.peers:
            from sglang_glm5 import peers

            peers.load_marlin(args.marlin_lib)
            print(f"bench: Marlin ({args.marlin_lib}) and ours against the float64 reference")
            print(bench_real.NUMERICS_HEADER)
            for name in args.shape:
                numerics += bench_real.check_marlin(bench_real.LAYOUTS[bench_real.SHAPE_LAYOUTS[name]], seed=seed)
        header = bench_real.HEADER_MARLIN if args.peers else bench_real.HEADER
        for name in args.shape:
            for skew in args.skew:
                print(f"bench: {name}, real routing, skew {skew}, seed {seed}\n{header}", flush=True)
                layout = bench_real.LAYOUTS[bench_real.SHAPE_LAYOUTS[name]]
                rows += bench_real.run(layout, args.batch, seed, skew=skew, baselines=not args.no_baselines,
                                       op_kwargs=path_kwargs, rounds=args.rounds, peers=tuple(args.peers))  # fmt: skip
        md = bench_real.write_results(Path(args.out), args.name, rows, bench.environment(), numerics)
        if not all(c["ok"] for c in numerics):
            print("bench: Marlin or ours missed its bound against the float64 reference (table above)", file=sys.stderr)
            return 1
        print(f"bench: wrote {md} and {md.with_suffix('.json')}")
        return 0
    shapes = [parse_shape(s) for s in args.shape]
    results = {}
    bw = 0.0
    for shape in shapes:
        ms = tuple(m for m in args.m if (m * shape.num_experts) % shape.top_k == 0)
        print(f"bench: {shape}, seed {seed}\n{bench.HEADER}", flush=True)
        results[shape], bw = bench.run(shape, ms, seed, with_baselines=not args.no_baselines, op_kwargs=path_kwargs)
    md = bench.write_results(Path(args.out), args.name, results, bw)
    print(f"bench: wrote {md} and {md.with_suffix('.json')}")
    return 0


def _cmd_tune(args: argparse.Namespace) -> int:
    """Pick tile configs of a kernel family (--path) for a target GPU: measured on the local GPU, else
    feasible picks offline. The same tuner for every family (``tuner.tune`` over ``variants.get``)."""
    from pathlib import Path

    from sglang_glm5 import autotune, env, tuner, variants
    from sglang_glm5._files import check_cache_dir, check_writable
    from sglang_glm5.hardware import resolve
    from sglang_glm5.shapes import parse_shape

    variant = variants.get(args.path)
    if not variant.kernels:
        raise ValueError(f"--path {args.path}: {variant.title} has no tiles to tune")
    if args.kernels:
        if variant.after_tune:
            raise ValueError(f"--kernels: --path {args.path} tunes its GEMMs together (its threshold needs both)")
        wanted = tuple(k for k in args.kernels.split(",") if k)
        if not wanted or set(wanted) - set(variant.kernels):
            raise ValueError(f"--kernels: expected some of {','.join(variant.kernels)}, got {args.kernels!r}")
        variant = dataclasses.replace(variant, kernels=tuple(k for k in variant.kernels if k in wanted))
    if args.batch_sizes:  # entries are stored and read under power-of-two buckets and decode steps only
        asked, args.batch_sizes = args.batch_sizes, autotune.tune_buckets(args.batch_sizes)
        if asked != args.batch_sizes:
            print(f"tune: --batch-sizes {','.join(map(str, asked))} -> buckets {','.join(map(str, args.batch_sizes))}")
        if not variant.decode_buckets and min(args.batch_sizes) < 1:
            raise ValueError(f"--path {args.path} tunes prefill sizes: --batch-sizes must be whole tokens per "
                             "expert (>= 1)")  # fmt: skip
    import torch

    local = None
    if torch.cuda.is_available():
        from sglang_glm5.hardware import detect

        local = detect()
    if args.target == "local" and local is None:
        raise ValueError(
            "--target local: torch sees no CUDA GPU here; name the target instead (--target rtx-pro-6000 "
            "tunes offline: AOT-checked picks, not measured)"
        )
    target = local if args.target == "local" else resolve(args.target)
    if not variant.runs_on(target.arch):
        raise ValueError(f"--path {args.path} needs {variant.requires}, got {target.name} ({target.sm})")
    measure = local is not None and local.name == target.name and local.arch == target.arch
    if args.splits_only and not (measure and variant.step_split_targets):
        raise ValueError(
            f"--splits-only times K split plans of {variant.title} on the target's own GPU (--target local)"
            if variant.step_split_targets else f"--splits-only: {variant.title} has no K split plans"
        )  # fmt: skip
    check_cache_dir()  # before minutes of compiles and timings: the compiles are memoized there
    out = Path(args.out) if args.out else autotune.user_cache_path(target)
    check_writable(out, "--out" if args.out else env.CACHE_DIR.name)
    mode = "measuring on this GPU" if measure else "offline (no GPU of this kind here): feasible picks, not measured"
    print(f"tune --path {args.path}: {target.name} ({target.sm}, {target.shared_per_block} B shared per block), {mode}")
    seed = int.from_bytes(os.urandom(4), "little")
    buckets = list(args.batch_sizes or variant.tune_buckets)
    total = tuner.TuneReport()
    rc = 0
    picked: dict = {}
    for shape in [parse_shape(s) for s in args.shape]:
        bench = variants.resolve(variant.kernel_bencher)(shape, seed) if measure else None
        entries, report = tuner.tune(
            target, shape, buckets, bench, variant=variant, progress=tuner.print_progress, survey=not args.no_survey,
            tiles=autotune.tiles_in_use(target, shape, variant.name) if args.splits_only else None,
        )  # fmt: skip
        autotune.store(out, target, entries)
        picked.update(entries)
        total.add(report)
        print(f"\ntune: {shape}: {len(entries)} {variant.title} entries -> {out}")
        if variant.after_tune:
            rc = max(rc, variants.resolve(variant.after_tune)(target, shape, entries, buckets, seed, out, measure))
    for line in total.space_lines(target, f"{variant.title} "):
        print(f"tune: {line}")
    if measure:
        print(f"tune: {total.summary()}")
        print("tune: next: `sglang-glm5 doctor` checks every tile this GPU's op may launch, then serve (README)")
    else:
        print(f"tune: {shipped_comparison(target, picked)}")
    from sglang_glm5.w4a4_select import clear_memo

    clear_memo()  # the op in this process reads the new entries and thresholds
    return rc


class _Parser(argparse.ArgumentParser):
    """An option a command does not know is refused by that command's parser, with its usage (argparse leaves
    it to the top-level parser, whose usage names no option of the command)."""

    top_level = False  # set on the parser of `sglang-glm5` itself; its subcommands' parsers are of this class too

    def parse_known_args(self, args=None, namespace=None):
        namespace, extras = super().parse_known_args(args, namespace)
        if extras and not self.top_level:
            known = [o for action in self._actions for o in action.option_strings if o.startswith("--")]
            close = [difflib.get_close_matches(x.split("=")[0], known, 1) for x in extras]
            hints = [f"{x} (did you mean {c[0]}?)" if c else x for x, c in zip(extras, close, strict=True)]
            self.error(f"unrecognized arguments: {' '.join(hints)}")
        return namespace, extras


def shipped_comparison(target, picked: dict) -> str:
    """One line: how offline picks (cache key -> ``autotune.Entry``) compare with the cache shipped for the target,
    and what to run next."""
    from sglang_glm5 import autotune

    shipped_path = autotune.shipped_cache_path(target)
    data = autotune.read_cache_file(shipped_path) or {}
    shipped = data.get("entries") if isinstance(data.get("entries"), dict) else {}
    ours = {key: entry.as_json()["config"] for key, entry in picked.items()}
    theirs = {key: shipped[key].get("config") for key in ours if isinstance(shipped.get(key), dict)}
    same = sum(theirs.get(key) == config for key, config in ours.items())
    measure = f"on the {target.name} GPU itself `sglang-glm5 tune --target local` measures its own"
    if ours and same == len(ours):
        return (f"the {same} picks equal the shipped ones ({shipped_path.name}), which the op reads without this "
                f"run: nothing changes; {measure}")  # fmt: skip
    if not theirs:
        return f"the package ships no offline picks for these {len(ours)} entries; the op now reads them; {measure}"
    return (f"{len(ours) - same} of {len(ours)} picks differ from the shipped ones ({shipped_path.name}; "
            f"{len(ours) - len(theirs)} of them new); the op now reads them; {measure}")  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    from sglang_glm5 import variants  # the path vocabulary (no torch)

    parser = _Parser(
        prog="sglang-glm5", description="SM120-aware NVFP4 MoE kernels for serving GLM-5-NVFP4 with SGLang."
    )
    parser.top_level = True
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    importlib.import_module("sglang_glm5.quickstart").add_cli(sub)  # the first command, first in the list

    p = sub.add_parser(
        "selfcheck",
        help="run the NVFP4 MoE op on a GLM-5-shaped layer and check it against the float64 reference",
        description="Runs sglang_glm5.moe.nvfp4_fused_moe on random NVFP4 weights and routings and compares it "
        "with the float64 torch reference. On a GPU the default shape is one GLM-5 layer under 8-way expert "
        "parallelism (glm5-ep8); without a GPU the kernels run through the Triton interpreter on glm5-mini.",
    )
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto", help="default: cuda when present")
    p.add_argument("--shape", default=None, help="glm5-ep8, glm5-tp8, glm5-mini or E,H,I (default: by device)")
    p.add_argument(
        "--tokens", type=int_list, default=None,
        help="token counts, comma separated (default 1,7,64; with --path w4a4: 7,256,2048)",
    )  # fmt: skip
    p.add_argument("--seed", type=int, default=None, help="random seed (default: fresh)")
    p.add_argument(
        "--path", choices=variants.NAMES, default="w4a16",
        help=f"which kernels to check: {PATH_HELP}. With w4a4 (SM12x GPUs only, exit 2 elsewhere) the W4A4 op "
        "and the W4A16 op both run against the float64 reference (W4A4 within the error bound its NVFP4 "
        "activations imply). It records nothing: `tune --path w4a4` runs the same check before it lets "
        "path='auto' take W4A4",
    )  # fmt: skip
    p.set_defaults(func=_cmd_selfcheck)

    p = sub.add_parser(
        "bench",
        help="time the NVFP4 MoE op against bf16 grouped GEMMs on the local GPU, at real or balanced routing",
        description="--routing real (default): for each B tokens per step, expert ids from a top-8 of 256 (other "
        "ranks' slots -1 under EP8), times nvfp4_fused_moe and torch _grouped_mm on bf16 weights on the same local "
        "slots, replayed from CUDA graphs up to B = 256 (as SGLang runs decode), against the bytes of the experts "
        "the step touches at the copy bandwidth measured in the same run. --routing balanced: for each m (tokens "
        "per expert, every local expert busy) also NVFP4 dequantize + _grouped_mm, eager and (m <= 128) from "
        "graphs, against all the layer's weight bytes. Writes NAME.json and NAME.md under --out.",
    )
    p.add_argument("--routing", choices=("real", "balanced"), default="real", help="expert ids (default: real)")
    p.add_argument("--shape", nargs="+", default=["glm5-ep8", "glm5-tp8"], help="shapes (glm5-ep8 glm5-tp8)")
    p.add_argument("--batch", type=int_list, default=list(REAL_BATCHES), help="real routing: tokens per step B")
    p.add_argument("--skew", type=float, nargs="+", default=[0.0, 1.0],
                   help="real routing: spread of a fixed per-expert logit bias (0 = uniform; default 0 1)")  # fmt: skip
    p.add_argument("--rounds", type=positive(int), default=7,
                   help="real routing, eager sizes (B > 256): time the op and bf16 in turn N times and report the "
                   "medians, with the range of bf16 / ours over the rounds (default 7)")  # fmt: skip
    p.add_argument("--m", type=int_list, default=list(DEFAULT_M), help="balanced routing: tokens per expert")
    p.add_argument("--out", default="bench", help="output folder (bench)")
    p.add_argument("--name", default="moe_bench", help="file name stem (moe_bench)")
    p.add_argument("--seed", type=int, default=None, help="random seed (default: fresh)")
    p.add_argument("--no-baselines", action="store_true", help="time only our op")
    p.add_argument("--peers", nargs="*", choices=("marlin",), default=[],
                   help="real routing: also time these peers on the same weights and routings (marlin: vLLM's "
                   "Marlin MoE, bench/peers/build_marlin.py), checked against the float64 reference")  # fmt: skip
    p.add_argument("--marlin-lib", default=".peers/build/glm5_marlin_peer.so",
                   help="the Marlin peer's library (default .peers/build/glm5_marlin_peer.so)")  # fmt: skip
    p.add_argument(
        "--path", choices=tuple(p for p in variants.PATHS if p != "w4a4"), default="auto",
        help="the op's path= (default auto; w4a16 or dense pin one family). The layers here have no checkpoint "
        "input scales, so W4A4 never runs: `tune --path w4a4` times it against W4A16 on an SM12x GPU",
    )  # fmt: skip
    p.set_defaults(func=_cmd_bench)

    p = sub.add_parser(
        "tune",
        help="pick MoE tile configs for a GPU, never trying one that does not fit its shared memory",
        description="For each MoE GEMM and batch size, prunes the configs whose shared memory exceeds the target's "
        "per-block limit (an analytic bound, then Triton's ahead-of-time compile for that architecture: no GPU "
        "needed), then benchmarks the rest when the target is this machine's GPU (below one token per expert, the "
        "three fastest W4A16 tiles are timed again aiming their K split at 1 and 4 programs per SM); otherwise "
        "stores the feasible config nearest the built-in heuristic (for decode, with fewer stages where the "
        "heuristic's would hold fewer programs an SM by shared memory than the launch is sized for), marked "
        "measured: false and keyed by the "
        "architecture and shared memory per block, so that every GPU sharing both reads it. Prints per GEMM the "
        "candidates, how many the shared-memory model and the compiler ruled out, and the largest tile that fits. "
        "Writes the user cache ($SGLANG_GLM5_CACHE_DIR/autotune/TARGET.json) unless --out is given.",
    )
    p.add_argument("--target", default="rtx-pro-6000", help="rtx-pro-6000 (default), h200, local, ... or smXY")
    p.add_argument("--shape", nargs="+", default=["glm5-ep8"], help="glm5-ep8 (default), glm5-tp8, E,H,I")
    p.add_argument(
        "--batch-sizes", type=bucket_list, default=None,
        help="tokens per expert to tune for (each rounded up to a power of two, from 1/32 to 4096, or at most "
        "1/2 to a multiple of 1/32, duplicates dropped: lookups read those buckets only; fractions for decode "
        "under expert parallelism, 1/32 = one GLM-5 token per step, 3/32 = three, which a lookup at that step reads "
        "before its power-of-two bucket; default 1/32,1/16,...,2048; with --path w4a4: 16,32,...,2048)",
    )  # fmt: skip
    p.add_argument("--out", default=None, help="cache file to write (default: the user cache of the target)")
    p.add_argument(
        "--splits-only", action="store_true",
        help="on the local GPU only (--target local), keep the tile a lookup picks now for each batch size (its "
        "entry, a nearby bucket's, or the heuristic) and time only its K split plans (the default, 2 programs per SM, "
        "then 1, 3, 4, 6 and 8, one per distinct split count; for gemm1 also the stream-K schedule at 2 and 3 "
        "programs per SM and, on sm_90, up to 8 tokens per expert the Gluon gemm1's tiles with their split plans, "
        "above that the same tile in Gluon and a 256-deep Gluon tile), "
        "storing the fastest if it beats the default plan by 2%% (else the tile with the default plan): about a "
        "third of a full search's timings, for decode steps such as --batch-sizes 2/32,3/32,...,16/32. "
        "A power-of-two step (1/32, 1/16, ...) is its bucket: its entry is replaced. A batch size where the plan has "
        "no other split count and no other plan beats the default gets no entry",
    )  # fmt: skip
    p.add_argument(
        "--kernels", default=None,
        help="comma-separated GEMMs to tune (default: all of the path's; W4A16 only: gemm1, gemm2); the entries of "
        "the others stay",
    )  # fmt: skip
    p.add_argument(
        "--no-survey", action="store_true",
        help="offline: skip pruning the whole search space for the target (AOT compiles, memoized in the user "
        "cache), which reports per GEMM how many candidates its shared memory rules out; the picks stay the same",
    )  # fmt: skip
    p.add_argument(
        "--path", choices=tuple(n for n in variants.NAMES if n != "dense"), default="w4a16",
        help=f"which kernels to tune: {PATH_HELP.split('; dense')[0]}. With w4a4 the target must be SM12x "
        "(exit 2 otherwise); on such a local GPU it benchmarks the W4A4 tiles, measures the threshold (the "
        "smallest tokens per expert from which W4A4 beats W4A16) and checks W4A4 with its tiles against the "
        "float64 reference: only on a pass does it store the threshold, which lets path='auto' take W4A4 "
        "(exit 1 on a failure); offline it stores AOT-checked picks, marked measured: false, and no threshold",
    )  # fmt: skip
    p.set_defaults(func=_cmd_tune)

    for module in _COMMAND_MODULES:
        importlib.import_module(module).add_cli(sub)
    return parser


def bucket_list(text: str) -> list:
    """argparse type: comma-separated positive numbers of tokens per expert, fractions allowed (1/32)."""
    from sglang_glm5.autotune import parse_bucket

    try:
        values = [parse_bucket(v) for v in text.split(",") if v.strip()]
    except (ValueError, ZeroDivisionError):
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers (1/32,1,16), got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError(f"expected positive numbers, got {text!r}")
    return values


def version() -> str:
    """The installed distribution's version (the package's own when running from a source checkout)."""
    import importlib.metadata

    try:
        return importlib.metadata.version("sglang-glm5")
    except importlib.metadata.PackageNotFoundError:
        from sglang_glm5 import __version__

        return __version__


def require(module: str, what: str, extra: str) -> None:
    """ValueError (one line from main) when an optional dependency is missing."""
    import importlib.util

    if importlib.util.find_spec(module) is None:
        raise ValueError(f"{what} needs {module}, which is not installed: pip install 'sglang-glm5[{extra}]'")


def port_number(text: str) -> int:
    """argparse type: a TCP port, 1..65535."""
    try:
        port = int(text)
    except ValueError:
        port = 0
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port number 1..65535, got {text!r}")
    return port


def positive(kind: type):
    """argparse type: a finite number of ``kind`` (int or float) above 0."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not 0 < value < float("inf"):
            raise argparse.ArgumentTypeError(f"expected a positive {kind.__name__}, got {text!r}")
        return value

    return parse


def int_list(text: str) -> list[int]:
    """argparse type: comma-separated positive integers."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def main(argv: list[str] | None = None) -> int:
    """The console script. Output piped into a reader that stops early (``| head -1``) ends the command quietly."""
    try:
        try:
            return _run(argv)
        finally:
            sys.stdout.flush()  # a reader gone away shows here, not as a traceback at exit
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # what is still buffered goes nowhere
        return 141  # as a program ended by SIGPIPE


def _run(argv: list[str] | None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ValueError as e:
        print(f"sglang-glm5 {args.command}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
