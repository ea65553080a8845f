"""sglang-glm5: SM120-aware NVFP4 MoE kernels for SGLang. Importable without SGLang and without a GPU."""

from pathlib import Path as _Path

__version__ = "0.1.0"

# In a source checkout the subpackages kernels/, patches/, loadtest/ and configs/ sit next to this folder,
# not in it (pyproject's package-dir maps them here when installing). A Python started in the checkout's
# root has that root first on sys.path and finds this folder before the installed package: look for the
# subpackages next to it too, so that `import sglang_glm5.moe` works there as it does when installed.
_here = _Path(__file__).resolve().parent
if not (_here / "kernels").is_dir() and (_here.parent / "kernels" / "nvfp4_moe.py").is_file():
    __path__.append(str(_here.parent))  # noqa: F821 (a package's __path__)
del _here
