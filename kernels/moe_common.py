"""Device helpers every MoE kernel family shares (W4A16 ``nvfp4_moe``, W4A4 ``nvfp4_w4a4``, the routing and top-k
sum ``nvfp4_route``): rounding to the 16-bit type, programmatic dependent launch (PDL), the per-block ready counters
between the two GEMMs, and the GEMMs' prologue (a routing block's pairs, an expert's weight rows, a tile's columns).
"""

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


@triton.jit
def round_to(v, dtype: tl.constexpr, INTERPRETER: tl.constexpr):
    """fp32 -> dtype, round to nearest even (by hand for bf16 in the interpreter)."""
    if INTERPRETER and dtype == tl.bfloat16:
        bits = v.to(tl.int32, bitcast=True)
        bits = bits + 0x7FFF + ((bits >> 16) & 1)
        return (bits >> 16).to(tl.int16).to(tl.bfloat16, bitcast=True)
    else:
        return v.to(dtype)


@triton.jit
def after_previous_launch(PDL: tl.constexpr):
    """With PDL (programmatic dependent launch, sm_90+; ``routing.uses_pdl``): wait until the kernel before
    this one in the stream has finished and its writes are visible. Called before any memory access, so
    that nothing is read early nor written under a kernel still running. Without a PDL launch it returns
    at once."""
    if PDL:
        gdc_wait()


@triton.jit
def let_next_launch(PDL: tl.constexpr):
    """With PDL: the next kernel, if launched with PDL, may start once every program of this one has called
    this or exited; its programs then wait in ``after_previous_launch``, their launch latency hidden. The
    GEMMs call it after their K loop, the small kernels at their start."""
    if PDL:
        gdc_launch_dependents()


@triton.jit
def mark_block_ready(ready_ptr, pid_m, READY: tl.constexpr):
    """With READY: this program has stored its tile of h for routing block pid_m; count it in the block's ready counter
    (release), on which gemm2's programs of the block wait (``await_block``) instead of on the whole of gemm1."""
    if READY:
        tl.debug_barrier()  # every thread's h is written before the counter says so
        tl.atomic_add(ready_ptr + pid_m, 1, sem="release", scope="gpu")


@triton.jit
def await_block(ready_ptr, pid_m, tiles, READY: tl.constexpr):
    """With READY: wait until gemm1 has stored all ``tiles`` N tiles of h for routing block pid_m (acquire). (A
    ``nanosleep`` between reads of the counter measures no different.)

    Deadlock-free: gemm2 is launched after gemm1 (in stream order, or with PDL once every gemm1 program has started),
    so the programs it waits on are running or done."""
    if READY:
        while tl.atomic_add(ready_ptr + pid_m, 0, sem="acquire", scope="gpu") < tiles:
            pass


# The GEMM kernels' shared prologue (W4A16 in nvfp4_moe.py, W4A4 in nvfp4_w4a4.py): the rows of a routing block
# and the weight rows of an N tile. Inlined: each kernel compiles to what it did with the lines in place.


@triton.jit
def block_pairs(sorted_ids_ptr, pid_m, num_pairs, BLOCK_M: tl.constexpr):
    """The BLOCK_M pair ids of routing block pid_m, which of them are real (the rest is padding), and the
    ids as int64 with padding at 0 (for unmasked address arithmetic)."""
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    pair = tl.load(sorted_ids_ptr + offs_m)
    row_ok = pair < num_pairs
    return pair, row_ok, tl.where(row_ok, pair, 0).to(tl.int64)


@triton.jit
def expert_rows(w_ptr, ws_ptr, expert, rows, stride_we, stride_wn, stride_se, stride_sn):
    """Pointers to the packed weight rows and block-scale rows ``rows`` (int64) of ``expert`` (int64)."""
    return w_ptr + expert * stride_we + rows * stride_wn, ws_ptr + expert * stride_se + rows * stride_sn


@triton.jit
def tile_columns(pid_n, size, BLOCK_N: tl.constexpr):
    """Output columns of tile pid_n: (offsets, in range, int64 offsets clamped to 0 for unmasked loads)."""
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < size
    return offs_n, n_ok, tl.where(n_ok, offs_n, 0).to(tl.int64)
