"""Build vLLM's Marlin MoE kernel (NVFP4 weights x bf16 activations) as a standalone torch extension.

The peer the W4A16 op is timed against in ``bench --peers marlin``. Reads vLLM's sources from a tree given
by path (never copied into this repository) and compiles, with torch's extension builder (ninja):

- ``csrc/moe/marlin_moe_wna16/ops.cu`` (``moe_wna16_marlin_gemm``) with a kernel selector trimmed to the
  15 NVFP4 x bf16 kernels (5 m-block sizes x 3 thread configs), one instantiation a file so that they
  compile in parallel;
- ``csrc/quantization/marlin/gptq_marlin_repack.cu`` (the weight repack);
- ``csrc/moe/moe_align_sum_kernels.cu`` (``moe_align_block_size``, ``moe_sum``);
- a bindings file of ours with the ops' schemas (vLLM's live in its ``torch_bindings.cpp`` files).

The kernel instantiations and the selector come from vLLM's own generator
(``csrc/quantization/marlin/generate_kernels.py``), filtered here. The ops register under torch's
``_moe_C`` and ``_C`` namespaces, as in vLLM (``sglang_glm5.peers`` calls them).

    python bench/peers/build_marlin.py --vllm .peers/vllm --build-dir .peers/build   # prints the .so path

Tested against vLLM 0.34.0's sources (its sdist), torch 2.11 and nvcc 13. A rebuild with unchanged
sources reuses the objects (ninja); ``--only-kernels N`` compiles the first N kernels alone (a quicker
compile check; that library misses the rest). ``--export DIR`` copies the files the build reads (16, about
260 KB) into DIR as a vLLM-shaped tree, small enough to carry to a GPU machine.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

NAME = "glm5_marlin_peer"
NVFP4_BF16 = ("vllm::kBFloat16", "vllm::kFE2M1f", "vllm::kBFloat16", "vllm::kFE4M3fn")
EXPECTED_KERNELS = 15
TORCH_TARGET_VERSION = "0x020B000000000000ULL"  # torch 2.11's stable ABI
# The files of vLLM's tree the build reads (the compile's dependencies, and the generator): what --export copies.
SOURCES = (
    "csrc/core/cuda_compat.h",
    "csrc/core/scalar_type.hpp",
    "csrc/core/utils.hpp",
    "csrc/dispatch_utils.h",
    "csrc/moe/marlin_moe_wna16/kernel.h",
    "csrc/moe/marlin_moe_wna16/marlin_template.h",
    "csrc/moe/marlin_moe_wna16/ops.cu",
    "csrc/moe/moe_align_sum_kernels.cu",
    "csrc/quantization/marlin/dequant.h",
    "csrc/quantization/marlin/generate_kernels.py",
    "csrc/quantization/marlin/gptq_marlin_repack.cu",
    "csrc/quantization/marlin/marlin.cuh",
    "csrc/quantization/marlin/marlin_dtypes.cuh",
    "csrc/quantization/marlin/marlin_mma.h",
    "csrc/quantization/vectorization.cuh",
    "csrc/torch_utils.h",
)

BINDINGS = """// Schemas of the ops the Marlin peer uses (vLLM defines them in its torch_bindings.cpp files).
#include <cstdint>
#include <optional>

#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/tensor.h>

using torch::stable::Tensor;

void moe_sum(Tensor& input, Tensor& output, std::optional<Tensor> topk_ids, std::optional<Tensor> expert_map);
void moe_align_block_size(Tensor topk_ids, int64_t num_experts, int64_t block_size, Tensor sorted_token_ids,
                          Tensor experts_ids, Tensor num_tokens_post_pad, std::optional<Tensor> maybe_expert_map,
                          std::optional<Tensor> scatter_idx);

STABLE_TORCH_LIBRARY(_moe_C, m) {
  m.def("moe_sum(Tensor input, Tensor! output, Tensor? topk_ids=None, Tensor? expert_map=None) -> ()");
  m.def("moe_align_block_size(Tensor topk_ids, int num_experts, int block_size, Tensor! sorted_token_ids, "
        "Tensor! experts_ids, Tensor! num_tokens_post_pad, Tensor? maybe_expert_map, "
        "Tensor(a!)? scatter_idx=None) -> ()");
  m.def("moe_wna16_marlin_gemm(Tensor! a, Tensor? c_or_none, Tensor! b_q_weight, Tensor? b_bias_or_none, "
        "Tensor! b_scales, Tensor? global_scale, Tensor? b_zeros_or_none, Tensor! workspace, "
        "Tensor sorted_token_ids, Tensor! expert_ids, Tensor! num_tokens_past_padded, Tensor! topk_weights, "
        "int moe_block_size, int top_k, bool mul_topk_weights, int b_type_id, int size_m, int size_n, "
        "int size_k, bool use_atomic_add, bool use_fp32_reduce, bool is_zp_float, int thread_k, int thread_n, "
        "int blocks_per_sm) -> Tensor");
}

STABLE_TORCH_LIBRARY_IMPL(_moe_C, CUDA, m) {
  m.impl("moe_sum", TORCH_BOX(&moe_sum));
  m.impl("moe_align_block_size", TORCH_BOX(&moe_align_block_size));
}

STABLE_TORCH_LIBRARY(_C, m) {
  m.def("gptq_marlin_repack(Tensor b_q_weight, SymInt size_k, SymInt size_n, int num_bits) -> Tensor");
}
"""


def write_if_changed(path: Path, text: str) -> None:
    """Write only when the content differs, so that ninja keeps the objects of unchanged sources."""
    if not path.exists() or path.read_text() != text:
        path.write_text(text)


def generate(vllm: Path, gen: Path, arch: str, count: int = EXPECTED_KERNELS) -> list[Path]:
    """Run vLLM's generator into a scratch folder, keep the NVFP4 x bf16 kernels: one .cu per instantiation
    and a trimmed ``kernel_selector.h`` in ``gen`` (the first ``count`` of them). Returns the kernel files."""
    scratch = gen / "all"
    scratch.mkdir(parents=True, exist_ok=True)
    generator = vllm / "csrc/quantization/marlin/generate_kernels.py"
    subprocess.run([sys.executable, str(generator), arch, str(scratch)], check=True)
    selector = (scratch / "kernel_selector.h").read_text()
    # Each branch: "if (<conditions>)\n  kernel = Marlin<...>;\n" (the first "if", the rest "else if").
    branches = re.findall(r"(?:else )?if \((.*?)\)\n\s*kernel = (Marlin<.*?>;)\n", selector)
    wanted = [f"a_type == {NVFP4_BF16[0]}", f"b_type == {NVFP4_BF16[1]}", f"c_type == {NVFP4_BF16[2]}",
              f"s_type == {NVFP4_BF16[3]}"]  # fmt: skip
    kept = [(cond, kernel) for cond, kernel in branches if all(w in cond.split(" && ") for w in wanted)]
    if len(kept) != EXPECTED_KERNELS:
        raise RuntimeError(f"expected {EXPECTED_KERNELS} NVFP4 x bf16 kernels in {generator}'s selector, found "
                           f"{len(kept)} of {len(branches)} branches")  # fmt: skip
    lines = ["// NVFP4 x bf16 branches of vLLM's generated kernel_selector.h"]
    for i, (cond, kernel) in enumerate(kept[:count]):
        lines.append(f"{'if' if i == 0 else 'else if'} ({cond})\n  kernel = {kernel}")
    write_if_changed(gen / "kernel_selector.h", "\n".join(lines) + "\n")

    source = next(scratch.glob("sm80_kernel_bfloat16_fe2m1f_bfloat16.cu"), None)
    if source is None:
        raise RuntimeError(f"{generator} wrote no sm80_kernel_bfloat16_fe2m1f_bfloat16.cu into {scratch}")
    text = source.read_text()
    head = text[: text.index("template __global__")]
    prefix = "template __global__ void Marlin<" + ", ".join(f"{t}.id()" for t in NVFP4_BF16) + ","
    insts = [line for line in text.splitlines() if line.startswith(prefix)]
    if len(insts) != EXPECTED_KERNELS:
        raise RuntimeError(f"expected {EXPECTED_KERNELS} NVFP4 x bf16 instantiations in {source}, found {len(insts)}")

    def bare(text: str) -> str:
        return re.sub(r"\s+", "", text).replace("template__global__void", "").replace("(MARLIN_KERNEL_PARAMS)", "")

    if [bare(k) for _, k in kept] != [bare(i) for i in insts]:
        raise RuntimeError(f"the selector's kernels and {source}'s instantiations differ in order or content")
    files = []
    for i, inst in enumerate(insts[:count]):
        path = gen / f"kernel_nvfp4_bf16_{i:02d}.cu"
        write_if_changed(path, f"{head}{inst}\n\n}}\n")
        files.append(path)
    return files


def cuda_home() -> Path | None:
    """CUDA_HOME if set, else the toolkit holding the nvcc on PATH (through a wrapper script that execs it)."""
    if os.environ.get("CUDA_HOME"):
        return Path(os.environ["CUDA_HOME"])
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        nvcc = Path(folder) / "nvcc"
        if nvcc.is_file():
            real = nvcc.resolve()
            found = (
                re.search(r"exec (\S+/bin/nvcc)", real.read_text(errors="ignore"))
                if real.stat().st_size < 4096
                else None
            )
            return Path(found.group(1)).parent.parent if found else real.parent.parent
    return None


def cublas_include(home: Path | None) -> list[str]:
    """vLLM's torch_utils.h includes cublas_v2.h: the toolkit's, else a pip nvidia package's."""
    if home is not None and (home / "include/cublas_v2.h").is_file():
        return []
    import site

    for root in site.getsitepackages():
        hits = sorted(Path(root).glob("nvidia/*/include/cublas_v2.h"))
        if hits:
            return [str(hits[0].parent)]
    return []


def build(vllm: Path, build_dir: Path, arch: str, jobs: int, only_kernels: int | None, verbose: bool) -> Path:
    """Compile and load the extension; returns the path of the shared library."""
    home = cuda_home()
    if home is not None:  # before torch's extension builder reads it at import
        os.environ["CUDA_HOME"] = str(home)
    import torch.utils.cpp_extension as ext

    vllm, build_dir = vllm.resolve(), build_dir.resolve()
    csrc = vllm / "csrc"
    for rel in ("moe/marlin_moe_wna16/ops.cu", "quantization/marlin/gptq_marlin_repack.cu",
                "moe/moe_align_sum_kernels.cu", "core/scalar_type.hpp"):  # fmt: skip
        if not (csrc / rel).is_file():
            raise FileNotFoundError(f"no {csrc / rel}: --vllm must be a vLLM source tree (its csrc/ folder)")
    gen = build_dir / "gen"
    gen.mkdir(parents=True, exist_ok=True)
    kernels = generate(vllm, gen, arch, EXPECTED_KERNELS if only_kernels is None else only_kernels)
    bindings = gen / "bindings.cpp"
    write_if_changed(bindings, BINDINGS)
    sources = [csrc / "moe/marlin_moe_wna16/ops.cu", csrc / "quantization/marlin/gptq_marlin_repack.cu",
               csrc / "moe/moe_align_sum_kernels.cu", bindings, *kernels]  # fmt: skip
    common = ["-O3", "-std=c++17", f"-DTORCH_TARGET_VERSION={TORCH_TARGET_VERSION}", "-DENABLE_FP8", "-DUSE_CUDA"]
    cuda_flags = [
        *common,
        "-static-global-template-stub=false",  # nvcc 13: else "undefined hidden symbol" at link
        "--expt-relaxed-constexpr",
        "--expt-extended-lambda",
        # torch's extension builder defines these; Marlin uses the half/bf16 operators and conversions.
        "-U__CUDA_NO_HALF_OPERATORS__",
        "-U__CUDA_NO_HALF_CONVERSIONS__",
        "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
        "-U__CUDA_NO_HALF2_OPERATORS__",
    ]
    os.environ["TORCH_CUDA_ARCH_LIST"] = arch
    os.environ["MAX_JOBS"] = str(jobs)
    build_dir.mkdir(parents=True, exist_ok=True)
    ext.load(
        name=NAME,
        sources=[str(s) for s in sources],
        extra_cflags=common,
        extra_cuda_cflags=cuda_flags,
        extra_include_paths=[str(gen), str(csrc / "moe/marlin_moe_wna16"), str(csrc), *cublas_include(home)],
        build_directory=str(build_dir),
        is_python_module=False,
        verbose=verbose,
    )
    return build_dir / f"{NAME}.so"


def export(vllm: Path, dest: Path) -> None:
    """Copy the files of vLLM's tree that the build reads (SOURCES, about 260 KB) into dest, in the same layout:
    a tree small enough to travel to a GPU machine (kept in a folder git ignores)."""
    import shutil

    for rel in SOURCES:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(vllm / rel, dest / rel)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--vllm", type=Path, required=True, help="vLLM source tree (holds csrc/)")
    p.add_argument("--build-dir", type=Path, default=Path(".peers/build"), help="objects and the .so (.peers/build)")
    p.add_argument("--arch", default=None, help="TORCH_CUDA_ARCH_LIST entry, e.g. 9.0 (default: this GPU's)")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="parallel compiles (default: all cores)")
    p.add_argument("--only-kernels", type=int, default=None, help="compile the first N kernels only (a check)")
    p.add_argument("--verbose", action="store_true")
    p.add_argument("--export", type=Path, default=None, help="copy the sources the build reads here and stop")
    args = p.parse_args(argv)
    if args.export is not None:
        export(args.vllm, args.export)
        print(f"build_marlin: {len(SOURCES)} files of {args.vllm} copied to {args.export}")
        return 0
    arch = args.arch
    if arch is None:
        import torch

        if not torch.cuda.is_available():
            print("build_marlin: no GPU to read the arch from; pass --arch (e.g. 9.0)", file=sys.stderr)
            return 2
        major, minor = torch.cuda.get_device_capability()
        arch = f"{major}.{minor}"
    start = time.perf_counter()
    so = build(args.vllm, args.build_dir, arch, args.jobs, args.only_kernels, args.verbose)
    print(f"build_marlin: {so} (arch {arch}, {time.perf_counter() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
