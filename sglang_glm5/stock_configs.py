"""SM120-feasible configs for SGLang's own Triton fused-MoE kernel (the BF16 / FP8 MoE path).

SGLang reads one JSON file per MoE shape from ``$SGLANG_MOE_CONFIG_DIR/configs/triton_X_Y_Z/`` named
``E={E},N={N},device_name={torch device name, spaces as _}[,dtype=..][,block_shape=[n, k]].json``,
mapping a token count M to ``{BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K, GROUP_SIZE_M, num_warps,
num_stages}``. E is the experts on one GPU (plus one fused shared expert when shared-expert fusion is
on), N the expert intermediate size on one GPU (``w2.shape[2]``).

Every config written here is compiled ahead of time for sm_120 (SGLang's own ``fused_moe_kernel``,
in a worker process, no GPU) and dropped when its ``metadata.shared`` exceeds 101376 B. Among the
feasible ones a fixed heuristic picks (``preferred``); nothing is measured. ``sglang-glm5
stock-configs`` regenerates the shipped set (``sglang_glm5/configs/sglang_moe``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from sglang_glm5.hardware import SHARED_PER_BLOCK

LIMIT = SHARED_PER_BLOCK[120]  # 101376 B per block on SM120 / SM121
ARCH = 120
TOP_K = 8  # GLM-5
BLOCK_SHAPE = (128, 128)  # fp8_w8a8 block quantization of GLM-5-FP8
# torch.cuda.get_device_name() of the SM12x parts the files are written for.
DEVICE_NAMES: tuple[str, ...] = (
    "NVIDIA RTX PRO 6000 Blackwell Workstation Edition",
    "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition",
    "NVIDIA RTX PRO 6000 Blackwell Server Edition",
)
# GLM-5: 256 routed experts, expert intermediate 2048. TP8: every GPU holds all experts, N = 2048 / 8.
# EP8: 32 experts per GPU, N = 2048. E + 1 when SGLang fuses the shared expert into the MoE layer.
SHAPES: tuple[tuple[str, int, int], ...] = (
    ("glm5-tp8", 256, 256),
    ("glm5-tp8+shared", 257, 256),
    ("glm5-ep8", 32, 2048),
    ("glm5-ep8+shared", 33, 2048),
)
DTYPES: tuple[str | None, ...] = (None, "fp8_w8a8")  # None: bf16 weights and activations
M_GRID = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024, 1536, 2048, 3072, 4096)
KEYS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages")
META_FILE = "sglang_glm5_meta.json"


def user_dir() -> Path:
    """Where ``stock-configs`` writes without ``--out``: the user cache, never the installed package."""
    from sglang_glm5.env import cache_dir

    return cache_dir() / "sglang_moe"


def shipped_dir() -> Path:
    from importlib.resources import files

    return Path(str(files("sglang_glm5.configs") / "sglang_moe"))


def triton_dir(version: str) -> str:
    return "triton_" + version.replace(".", "_")


def file_name(num_experts: int, n: int, dtype: str | None, device_name: str) -> str:
    """The file name SGLang 0.5.23 looks up for this shape (its get_config_file_name)."""
    name = f"E={num_experts},N={n},device_name={device_name.replace(' ', '_')}"
    if dtype:
        name += f",dtype={dtype}"
    if dtype == "fp8_w8a8":
        name += f",block_shape={list(BLOCK_SHAPE)}"
    return name + ".json"


def preferred(m: int, num_experts: int, dtype: str | None) -> list[dict[str, int]]:
    """Candidates for M tokens, best first; the first that fits wins.

    Heuristic (unmeasured): BLOCK_SIZE_M follows the expected tokens per expert (M * top-k / E) from
    16 to 128; BLOCK_SIZE_N 64 for M-blocks up to 32 rows (more programs while decoding), else 128;
    BLOCK_SIZE_K 128 for fp8 (one scale block) and 64 for bf16 (the same bytes per row); GROUP_SIZE_M 1
    for small blocks, 16 otherwise; 8 warps for 128 x 128 tiles. Stages 4, then 3, then 2 (SM120 runs
    mma.sync with cp.async pipelining: num_stages - 1 buffers), then half BLOCK_SIZE_N, half BLOCK_SIZE_M.
    """
    per_expert = m * TOP_K / num_experts
    bm = next((b for b in (16, 32, 64) if per_expert <= b), 128)
    bn = 64 if bm <= 32 else 128
    bk = 128 if dtype == "fp8_w8a8" else 64
    out = []
    for tile_m, tile_n in ((bm, bn), (bm, bn // 2), (max(bm // 2, 16), bn // 2)):
        for stages in (4, 3, 2):
            warps = 8 if tile_m * tile_n >= 128 * 128 else 4
            group = 1 if tile_m <= 32 else 16
            out.append(dict(zip(KEYS, (tile_m, tile_n, bk, group, warps, stages), strict=True)))
    return out


def _key(cfg: dict[str, int], dtype: str | None) -> tuple:
    return (dtype, *(cfg[k] for k in KEYS))


def compiled_shared(items: list[tuple[str | None, dict[str, int]]]) -> list[int]:
    """Shared memory on sm_120 of SGLang's fused_moe_kernel for each (dtype, config), compiled ahead of time."""
    from sglang_glm5.aot import run_jobs

    results = run_jobs("sglang_glm5.stock_configs:aot_job", [[d, c] for d, c in items])
    failed = [(d, c, r) for (d, c), r in zip(items, results, strict=True) if isinstance(r, str)]
    if failed:
        raise RuntimeError(f"ahead-of-time compile of SGLang's fused_moe_kernel failed: {failed[0]}")
    return [int(v) for v in results]


def _compile(dtype: str | None, cfg: dict[str, int], swap_ab: bool) -> int:
    import triton
    import triton.language as tl
    from sglang.kernels.ops.moe.fused_moe_triton_kernels import fused_moe_kernel as fn
    from triton.backends.compiler import GPUTarget

    fp8 = dtype == "fp8_w8a8"
    consts = {
        # None arguments (no TMA descriptors, bias or LoRA mask) and the strides SGLang passes as 1
        # (Triton specializes 1: it is what makes the K loads contiguous and the loop pipelined).
        "a_desc": None, "b_desc": None, "bias_ptr": None, "add_mask_ptr": None,
        "stride_ak": 1, "stride_bk": 1, "stride_cn": 1, "stride_bsk": 1,
        "group_n": BLOCK_SHAPE[0] if fp8 else 0, "group_k": BLOCK_SHAPE[1] if fp8 else 0,
        **{k: v for k, v in cfg.items() if k.isupper()},
        "MUL_ROUTED_WEIGHT": False, "top_k": TOP_K, "compute_type": tl.bfloat16, "use_fp8_w8a8": fp8,
        "use_int8_w8a8": False, "use_int8_w8a16": False, "per_channel_quant": False, "even_Ks": True,
        "c_sorted": False, "swap_ab": swap_ab, "FUSE_ADD_TO_OUTPUT": False, "MASK_OUTPUT": False,
        "FUSE_SUM_ALL_REDUCE": False, "ROUTER_TOPK": TOP_K, "FUSE_SWIGLU": False, "USE_GDC": True,
        "GDC_EARLY": False, "A_OUTPUT_SLICES": 1, "A_OUTPUT_SLICE_WIDTH": 0, "A_OUTPUT_SLICE_K": 0,
    }  # fmt: skip
    if not fp8:
        consts.update(a_scale_ptr=None, b_scale_ptr=None)
    ab = "*fp8e4nv" if fp8 else "*bf16"
    pointers = {
        "a_ptr": ab, "b_ptr": ab, "c_ptr": "*bf16", "a_scale_ptr": "*fp32", "b_scale_ptr": "*fp32",
        "topk_weights_ptr": "*fp32", "sorted_token_ids_ptr": "*i32", "expert_ids_ptr": "*i32",
        "num_tokens_post_padded_ptr": "*i32",
    }  # fmt: skip
    sig = {a: "constexpr" if a in consts else pointers.get(a, "i32") for a in fn.arg_names}
    attrs = {
        (i,): [["tt.divisibility", 16]]
        for i, a in enumerate(fn.arg_names)
        if sig[a] != "constexpr" and a != "num_valid_tokens"
    }
    src = triton.compiler.ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs)
    options = {"num_warps": cfg["num_warps"], "num_stages": cfg["num_stages"]}
    return int(triton.compile(src, target=GPUTarget("cuda", ARCH, 32), options=options).metadata.shared)


def aot_job(dtype: str | None, cfg: dict[str, int]) -> int:
    """One ahead-of-time compile (``sglang_glm5.aot`` worker): shared bytes of fused_moe_kernel on sm_120.

    fp8 configs with BLOCK_SIZE_M < 64 and BLOCK_SIZE_N >= 64 may run with swap_ab on (SGLang turns it
    on for SM90-capable parts): both variants compile and the larger counts.
    """
    swaps = [False]
    if dtype == "fp8_w8a8" and cfg["BLOCK_SIZE_M"] < 64 and cfg["BLOCK_SIZE_N"] >= 64:
        swaps.append(True)
    return max(_compile(dtype, cfg, s) for s in swaps)


def generate(out: Path, triton_version: str | None = None) -> list[Path]:
    """Write one file per (shape, dtype, device name) under out/configs/triton_X_Y_Z/, a README and metadata."""
    if triton_version is None:
        import triton

        triton_version = triton.__version__
    wanted: dict[tuple, tuple[str | None, dict[str, int]]] = {}
    for _, e, _n in SHAPES:
        for dtype in DTYPES:
            for m in M_GRID:
                for cfg in preferred(m, e, dtype):
                    wanted.setdefault(_key(cfg, dtype), (dtype, cfg))
    items = list(wanted.values())
    shared = dict(zip(wanted, compiled_shared(items), strict=True))
    folder = out / "configs" / triton_dir(triton_version)
    folder.mkdir(parents=True, exist_ok=True)
    written, meta_files, pruned = [], {}, set()
    for label, e, n in SHAPES:
        for dtype in DTYPES:
            table = {}
            for m in M_GRID:
                fits = [c for c in preferred(m, e, dtype) if shared[_key(c, dtype)] <= LIMIT]
                pruned.update(_key(c, dtype) for c in preferred(m, e, dtype) if shared[_key(c, dtype)] > LIMIT)
                if not fits:
                    raise RuntimeError(f"no candidate fits {LIMIT} B for E={e}, N={n}, dtype={dtype}, M={m}")
                table[str(m)] = fits[0]
            for device in DEVICE_NAMES:
                path = folder / file_name(e, n, dtype, device)
                path.write_text(json.dumps(table, indent=4) + "\n")
                written.append(path)
                meta_files[path.name] = {
                    "shape": label, "dtype": dtype or "bf16",
                    "max_shared_bytes": max(shared[_key(c, dtype)] for c in table.values()),
                }  # fmt: skip
    meta = {
        "measured": False,
        "target": f"sm_{ARCH}",
        "shared_limit_bytes": LIMIT,
        "triton": triton_version,
        "heuristic": "sglang_glm5.stock_configs.preferred",
        "pruned_candidates": sorted([list(map(str, k)) for k in pruned]),
        "files": meta_files,
    }
    (out / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    (out / "README.md").write_text(_README.format(limit=LIMIT, triton=triton_version))
    return written


_README = """# SM120 configs for SGLang's Triton fused-MoE kernel (unmeasured)

Written by `sglang-glm5 stock-configs`; the sglang-glm5 plugin points `SGLANG_MOE_CONFIG_DIR` here on
SM12x GPUs when `SGLANG_GLM5_STOCK_CONFIGS=1` asks for it and the variable is unset (opt-in: it
replaces SGLang's own config folder, whose tuned files for other models would then not be found).

- Every config compiles ahead of time for sm_120 (Triton {triton}, SGLang's own `fused_moe_kernel`)
  within {limit} B of shared memory per block; candidates above that were never chosen.
- **Not measured on a GPU**: chosen by a fixed heuristic (`sglang_glm5.stock_configs.preferred`).
  Re-tune on your GPU with SGLang's `benchmark/kernels/fused_moe_triton` for best speed.
- `sglang_glm5_meta.json`: per file, the shape, dtype and largest shared memory; `measured: false`.
- Setting `SGLANG_MOE_CONFIG_DIR` replaces SGLang's own folder: shapes not here use SGLang's default config.
"""


def _cmd(args: argparse.Namespace) -> int:
    from sglang_glm5._files import check_cache_dir, check_writable
    from sglang_glm5.cli import require
    from sglang_glm5.env import CACHE_DIR

    require("sglang", "stock-configs (it compiles SGLang's own fused_moe_kernel)", "sglang")
    if not args.out:
        check_cache_dir()  # before the compiles; a problem there names SGLANG_GLM5_CACHE_DIR, not --out
    out = Path(args.out) if args.out else user_dir()
    check_writable(out, "--out" if args.out else CACHE_DIR.name, folder=True)
    written = generate(out)
    print(f"stock-configs: wrote {len(written)} config files (sm_120, <= {LIMIT} B shared, unmeasured) under {out}")
    print(f"stock-configs: SGLang reads them with SGLANG_MOE_CONFIG_DIR={out}")
    return 0


def add_cli(subparsers) -> None:
    p = subparsers.add_parser(
        "stock-configs",
        help="write SM120-feasible configs for SGLang's own Triton fused-MoE kernel (BF16/FP8 MoE models)",
        description="For GLM-5's MoE under TP8 and EP8 (with and without a fused shared expert), bf16 and fp8_w8a8 "
        "with block_shape [128, 128], writes SGLang-named config files under OUT/configs/triton_X_Y_Z/. Each "
        "config is compiled ahead of time for sm_120 (no GPU needed) and kept only within 101376 B of shared "
        "memory; picks are heuristic, not measured. Needs SGLang installed. Default OUT: "
        "$SGLANG_GLM5_CACHE_DIR/sglang_moe (the package ships the same files, which the plugin uses under "
        "SGLANG_GLM5_STOCK_CONFIGS=1).",
    )
    p.add_argument(
        "--out", default=None, help="folder for SGLANG_MOE_CONFIG_DIR (default: $SGLANG_GLM5_CACHE_DIR/sglang_moe)"
    )
    p.set_defaults(func=_cmd)
