"""SiLU(gate) * up over the rows of a [R, 2I] tensor (gate first), in fp32: vLLM's ``silu_and_mul`` as one launch, for
the Marlin peer of the bench (``sglang_glm5.peers``). The op itself fuses this into its gemm1 epilogue."""

import triton
import triton.language as tl


@triton.jit
def silu_mul_kernel(
    src,  # [R, 2I] bf16: gate columns 0 .. I-1, up columns I .. 2I-1
    dst,  # [R, I] bf16 out
    inter,  # I
    BLOCK: tl.constexpr,  # columns a program
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < inter
    gate = tl.load(src + row * 2 * inter + cols, mask=mask).to(tl.float32)
    up = tl.load(src + row * 2 * inter + inter + cols, mask=mask).to(tl.float32)
    tl.store(dst + row * inter + cols, (gate / (1.0 + tl.exp(-gate)) * up).to(dst.dtype.element_ty), mask=mask)
