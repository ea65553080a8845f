"""Ahead-of-time probe (no GPU): other ways for gemm1 to load its weights and feed its dots, compiled for sm_90.

Each variant is the shipped gemm1 (``kernels/nvfp4_moe.py``, copied to a temporary module and edited) compiled for
sm_90 in the form its size launches (decode tiles: SPLITS 2, no block loop, block axis last; prefill tiles: no split,
the block loop) and the kernel_wgmma layout; printed: registers, stack (spills), shared memory, the K loop's
instructions, its WARPGROUP instructions (arrive and wait: 14 when the wgmma groups overlap as shipped, 2 per wgmma
when ptxas serializes them), whether ptxas reports C7513 (wgmma serialized), and the most wgmma groups Triton leaves
in flight at a wait (``pendings``).

- ``shipped``: cp.async for the packed weights, scales and activations.
- ``tma at use``: the packed weights and scales of gate and of up through TMA descriptors (device-side
  ``tl.make_tensor_descriptor``), each loaded where its quarters are decoded.
- ``tma at top``: the same four loads at the top of the K step, up decoded after gate's dots.
- ``one dot``: the four decoded quarters joined along K (``tl.join``, register-only) into one dot per K step, the
  activations loaded in the matching order.
- ``mma.sync``: the shipped kernel at 16 or 32 weight rows (below wgmma's 64: Triton takes mma.sync), whole K.

Usage: python bench/exp/aot_load_forms.py [OUT_DIR]   (EXP_TILE, default 16x128x256-w4-s3)
"""

import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "0"

import triton  # noqa: E402

from sglang_glm5.tiles import GemmConfig, compile_for_target  # noqa: E402
from sglang_glm5.variants import w4a16_tiles  # noqa: E402

KERNELS = Path(__file__).resolve().parents[2] / "kernels" / "nvfp4_moe.py"
BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
TILE = os.environ.get("EXP_TILE", "16x128x256-w4-s3")

HELPERS = """
from sglang_glm5.kernels.nvfp4_decode import decode_nvfp4, weight_tile


@triton.jit
def _concat_k(a, b):
    N: tl.constexpr = a.shape[0]
    Q: tl.constexpr = a.shape[1]
    return tl.reshape(tl.permute(tl.join(a, b), (0, 2, 1)), (N, 2 * Q))


@triton.jit
def _load_step(rows_ptr, k0, row_ok, BLOCK_K: tl.constexpr):
    # row q * (BLOCK_K // 4) + c: K column 4c + q of step k0 (the permuted storage, as load_quarters)
    Q: tl.constexpr = BLOCK_K // 4
    kk = tl.arange(0, BLOCK_K)
    pos = k0 + ((kk % Q) // 8) * 32 + (kk % Q) % 8 + 8 * (kk // Q)
    return tl.load(rows_ptr[None, :] + pos[:, None], mask=row_ok[None, :], other=0.0)


@triton.jit
def _dot_desc(acc, w, s, x0, x1, x2, x3, DTYPE: tl.constexpr, LAYOUT: tl.constexpr):
    w0, w1, w2, w3 = decode_nvfp4(w, s, DTYPE, LAYOUT, False)
    acc = tl.dot(w0, x0, acc)
    acc = tl.dot(w1, x1, acc)
    acc = tl.dot(w2, x2, acc)
    return tl.dot(w3, x3, acc)

"""
# the helpers go in before the first kernel-private function of the copied module
ANCHOR = "\n@triton.jit\ndef _permuted_column"

LOOP = """    for k0 in range(k_begin, k_end, BLOCK_K):
        x0, x1, x2, x3 = load_quarters(x_rows, k0, row_ok, hidden_size, BLOCK_K, EVEN_K, LAYOUT, INTERPRETER)
        acc_g = nvfp4_dot(
            acc_g, wg_rows, sg_rows, x0, x1, x2, x3, k0, hidden_size, BLOCK_K, EVEN_K, LAYOUT, INTERPRETER
        )
        acc_u = nvfp4_dot(
            acc_u, wu_rows, su_rows, x0, x1, x2, x3, k0, hidden_size, BLOCK_K, EVEN_K, LAYOUT, INTERPRETER
        )"""

DESCRIPTORS = """    rows_all = (stride_we // stride_wn) * 64  # E * 2I rows, E <= 64 (a compile-only bound)
    w_desc = tl.make_tensor_descriptor(w_ptr, shape=[rows_all, hidden_size // 4], strides=[stride_wn, 1],
                                       block_shape=[BLOCK_N, BLOCK_K // 4])
    s_desc = tl.make_tensor_descriptor(ws_ptr, shape=[rows_all, hidden_size // 16], strides=[stride_sn, 1],
                                       block_shape=[BLOCK_N, BLOCK_K // 16])
    rowg = (expert * (stride_we // stride_wn) + gate_row0 + pid_n * BLOCK_N).to(tl.int32)
    rowu = (expert * (stride_we // stride_wn) + up_row0 + pid_n * BLOCK_N).to(tl.int32)
    for k0 in range(k_begin, k_end, BLOCK_K):
        x0, x1, x2, x3 = load_quarters(x_rows, k0, row_ok, hidden_size, BLOCK_K, EVEN_K, LAYOUT, INTERPRETER)
        DT: tl.constexpr = x0.dtype
"""

LOOPS = {
    "tma at use": DESCRIPTORS
    + """
        acc_g = _dot_desc(acc_g, w_desc.load([rowg, k0 // 4]), s_desc.load([rowg, k0 // 16]), x0, x1, x2, x3, DT,
                          LAYOUT)
        acc_u = _dot_desc(acc_u, w_desc.load([rowu, k0 // 4]), s_desc.load([rowu, k0 // 16]), x0, x1, x2, x3, DT,
                          LAYOUT)""",
    "tma at top": DESCRIPTORS
    + """
        pg = w_desc.load([rowg, k0 // 4])
        sg = s_desc.load([rowg, k0 // 16])
        pu = w_desc.load([rowu, k0 // 4])
        su = s_desc.load([rowu, k0 // 16])
        acc_g = _dot_desc(acc_g, pg, sg, x0, x1, x2, x3, DT, LAYOUT)
        acc_u = _dot_desc(acc_u, pu, su, x0, x1, x2, x3, DT, LAYOUT)""",
    "one dot": """    for k0 in range(k_begin, k_end, BLOCK_K):
        xs = _load_step(x_rows, k0, row_ok, BLOCK_K)
        g0, g1, g2, g3 = weight_tile(wg_rows, sg_rows, k0, hidden_size, BLOCK_K, True, xs.dtype, LAYOUT, False)
        acc_g = tl.dot(_concat_k(_concat_k(g0, g1), _concat_k(g2, g3)), xs, acc_g)
        u0, u1, u2, u3 = weight_tile(wu_rows, su_rows, k0, hidden_size, BLOCK_K, True, xs.dtype, LAYOUT, False)
        acc_u = tl.dot(_concat_k(_concat_k(u0, u1), _concat_k(u2, u3)), xs, acc_u)""",
}


def slug(name: str) -> str:
    return re.sub(r"\W", "_", name)


def variant_module(name: str, loop: str, folder: Path):
    src = KERNELS.read_text()
    for anchor in (ANCHOR, LOOP):
        if anchor not in src:
            raise SystemExit(f"the kernel source changed: {anchor[:60]!r} not found; update this probe")
    src = src.replace(ANCHOR, HELPERS + ANCHOR, 1).replace(LOOP, loop, 1)
    path = folder / f"gemm1_{slug(name)}.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module  # Triton's JIT reads the source through the module
    spec.loader.exec_module(module)
    return module


def k_loop(sass: str) -> list[str]:
    """The instructions of the K loop: the backward branch around the most (H)MMAs, the tightest one if several."""
    lines = [ln for ln in sass.splitlines() if re.match(r"^\s+/\*[0-9a-f]{4}\*/", ln)]
    addr = [int(re.match(r"^\s+/\*([0-9a-f]{4})\*/", ln).group(1), 16) for ln in lines]
    best: list[str] = []
    key = (0, 0)
    for i, ln in enumerate(lines):
        m = re.search(r"BRA(?:\.U)?\s+(?:!?U?P\w,\s*)?0x([0-9a-f]+)", ln)
        if m and (target := int(m.group(1), 16)) < addr[i] and target in addr:
            body = lines[addr.index(target) : i + 1]
            mmas = sum("MMA" in b for b in body)
            if mmas and (mmas, -len(body)) > key:  # every MMA, in the tightest such loop
                best, key = body, (mmas, -len(body))
    return best


def probe(name: str, fn, cfg: GemmConfig, form: dict, folder: Path) -> dict:
    consts = {"BLOCK_M": cfg.block_m, "BLOCK_N": cfg.block_n, "BLOCK_K": cfg.block_k, "EVEN_K": True,
              "INTERPRETER": False, "LAYOUT": 2, "PDL": True, "BLOCKS_LAST": False, "READY": False, "STREAM": False,
              **form}  # fmt: skip
    k = compile_for_target(fn, consts, cfg, 90, w4a16_tiles._POINTERS, w4a16_tiles._NOT_DIVISIBLE)
    cubin = folder / f"{slug(name)}_{cfg.label}.cubin"
    cubin.write_bytes(k.asm["cubin"])
    sass = subprocess.run([BIN / "cuobjdump", "-sass", cubin], capture_output=True, text=True).stdout
    ptx = cubin.with_suffix(".ptx")
    ptx.write_text(k.asm["ptx"])
    ptxas = subprocess.run([BIN / "ptxas", "-arch=sm_90a", "-v", ptx, "-o", folder / "x.cubin"], capture_output=True,
                           text=True)  # fmt: skip
    usage = re.search(r"Used (\d+) registers", ptxas.stderr)
    stack = re.search(r"(\d+) bytes stack frame", ptxas.stderr)
    body = k_loop(sass)
    ops = Counter(re.split(r"[ .;]", re.sub(r"^\s+/\*[0-9a-f]{4}\*/\s+(@!?U?P\w\s+)?", "", b).strip())[0] for b in body)
    row = {"variant": name, "tile": cfg.label, "registers": int(usage.group(1)) if usage else None,
           "stack": int(stack.group(1)) if stack else None, "shared": int(k.metadata.shared),
           "k_loop": len(body), "mma": ops["HGMMA"] + ops["HMMA"], "warpgroup": ops["WARPGROUP"],
           "c7513": "C7513" in ptxas.stderr,
           "max_pendings": max(map(int, re.findall(r"pendings = (\d+)", k.asm["ttgir"])), default=None)}  # fmt: skip
    print(json.dumps(row), flush=True)
    return row


def main(out: Path) -> None:
    cfg = GemmConfig.from_label(TILE)
    # the form each size launches: decode tiles split K over the whole grid, prefill tiles walk the blocks unsplit
    split_form = {"SPLITS": 2, "BLOCK_LOOP": False, "BLOCKS_LAST": True}
    if cfg.block_m > 16:
        split_form = {"SPLITS": 1, "BLOCK_LOOP": True}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        sys.path.insert(0, tmp)
        from sglang_glm5.kernels import nvfp4_moe

        rows.append(probe("shipped", nvfp4_moe.nvfp4_moe_gemm1_kernel, cfg, split_form, folder))
        for name, loop in LOOPS.items():
            if name.startswith("tma") and cfg.block_k < 256:  # a TMA box needs >= 16 bytes a row: scales block_k / 16
                rows.append({"variant": name, "tile": cfg.label, "skipped": "scale tile under TMA's 16-byte rows"})
                continue
            rows.append(probe(name, variant_module(name, loop, folder).nvfp4_moe_gemm1_kernel, cfg, split_form, folder))
        for label in ("16x16x256-w1-s4", "16x32x256-w2-s4"):
            rows.append(probe("mma.sync", nvfp4_moe.nvfp4_moe_gemm1_kernel, GemmConfig.from_label(label),
                              {"SPLITS": 1, "BLOCK_LOOP": False}, folder))  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    (out / f"aot_load_forms_{TILE}.json").write_text(
        json.dumps({"triton": triton.__version__, "rows": rows}, indent=1) + "\n"
    )


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("."))
