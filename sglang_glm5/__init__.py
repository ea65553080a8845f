"""sglang-glm5: SM120-aware NVFP4 MoE kernels for SGLang. Importable without SGLang and without a GPU."""

__version__ = "0.1.0"
