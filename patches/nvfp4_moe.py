"""Hooks on SGLang's ``ModelOptNvFp4FusedMoEMethod`` (``srt/layers/quantization/modelopt_quant.py``).

Each hook checks the backend and, for anything but ``nvfp4_triton``, calls the original unchanged.
With ``nvfp4_triton``:

- ``__init__``: the stock check admits NVFP4 MoE only on Blackwell or with Marlin; our kernels run
  on SM80+ (and on the CPU through the Triton interpreter), so the original runs with that check passed.
  Inside a ``FusedMoE`` construction for nvfp4_triton (which ``layers`` starts with the stock backend, for
  layers of any other quantization) it claims the layer: nvfp4_triton for the rest of its construction.
- ``create_moe_runner``: no MoeRunner. The cached backend ``nvfp4_triton`` (what the stock
  ``get_moe_runner_backend`` returns) is not one of the global-id backends, so the standard
  dispatcher hands ``apply`` top-k output with local expert ids and -1 for other ranks' experts.
- ``process_weights_after_loading``: the stock code runs (it swizzles the block scales in place when
  their shape allows, computes alphas, configures the dispatcher), with the input scales sliced to
  this rank's experts; then the swizzled scales are put back in linear order in place, and the layer's
  weights are checked once and kept on it as an ``Nvfp4MoeWeights`` (w13 row order and this rank's
  input scales included). On a GPU the codes and block scales are then re-encoded in place for the W4A16
  decode (``nvfp4.to_kernel_layout``), unless the layer may take W4A4: the parameters then hold that layout.
- ``restore_weights_before_loading`` (inherited from SGLang's base class, hooked on this one): before a weight
  update, the checkpoint's layout back in place, so that reloaded and kept tensors agree.
- ``apply``: ``sglang_glm5.moe.fused_moe`` on that bundle -> ``StandardCombineInput``. The top-k weights
  already carry ``routed_scaling_factor`` for this method (``_fuses_routed_scaling_factor_in_topk``,
  ``srt/layers/moe/fused_moe_triton/layer.py``): it is not applied again. It passes ``path=`` from
  ``SGLANG_GLM5_MOE_PATH`` (auto | w4a16 | w4a4, default auto); the bundle carries this rank's input
  scales, which the W4A4 path quantizes activations with. The switch is read and checked when the weights are processed:
  a bad value, or w4a4 off SM12x, stops the server at load time, never mid-request.
"""

from __future__ import annotations

import contextlib
import logging

import torch

from sglang_glm5 import env
from sglang_glm5.patches import layers
from sglang_glm5.patches.guard import BACKEND_NAME
from sglang_glm5.patches.hooks import MethodHook, Symbol

logger = logging.getLogger("sglang_glm5.patches")

_MQ = "sglang.srt.layers.quantization.modelopt_quant"
_METHOD = f"{_MQ}.ModelOptNvFp4FusedMoEMethod"

# Layer attributes the plugin adds (plain attributes, not parameters: never saved or loaded).
WEIGHTS_ATTR = "sglang_glm5_weights"  # sglang_glm5.weights.Nvfp4MoeWeights over the layer's parameters
MOE_PATH_ATTR = "sglang_glm5_moe_path"  # "auto" | "w4a16" | "w4a4": the op's path= keyword

MOE_PATH_ENV = env.MOE_PATH.name


def moe_path_from_env() -> str:
    """$SGLANG_GLM5_MOE_PATH: "auto" (default), "w4a16" or "w4a4"; anything else is a ValueError."""
    from sglang_glm5.w4a4_select import min_tokens_from_env

    value = env.get(env.MOE_PATH)
    min_tokens_from_env()  # the threshold switches, checked now rather than at the first prefill
    from sglang_glm5.prefill import min_tokens

    min_tokens()
    return value


def _is_ours(backend) -> bool:
    return getattr(backend, "value", backend) == BACKEND_NAME


def _selected() -> bool:
    from sglang.srt.layers.moe.utils import get_moe_runner_backend

    return _is_ours(get_moe_runner_backend())


def _cached(method) -> bool:
    return _is_ours(getattr(method, "_moe_runner_backend", None))


# ---------------------------------------------------------------------------------------------


class _PlatformPassingNvfp4Check:
    """The platform as the stock __init__ sees it, with ``is_blackwell`` true."""

    def __init__(self, platform):
        self._platform = platform

    is_blackwell = True

    def __getattr__(self, name):
        return getattr(self._platform, name)


@contextlib.contextmanager
def _nvfp4_platform_check_passed():
    from sglang.srt.layers.quantization import modelopt_quant

    real = modelopt_quant.get_platform
    modelopt_quant.get_platform = lambda: _PlatformPassingNvfp4Check(real())
    try:
        yield
    finally:
        modelopt_quant.get_platform = real


def init_hook(original, self, quant_config):
    if layers.building_for_us():  # a FusedMoE layer built for nvfp4_triton turned out NVFP4: ours
        layers.claim_layer()
    elif not _selected():
        return original(self, quant_config)
    from sglang_glm5 import hardware

    arch = hardware.device_arch()
    if arch is not None and not hardware.runs_w4a16(arch):
        raise ValueError(f"--moe-runner-backend {BACKEND_NAME} needs an SM80+ GPU, got sm{arch}")
    with _nvfp4_platform_check_passed():
        original(self, quant_config)


def create_moe_runner_hook(original, self, layer, moe_runner_config):
    if not _selected():
        return original(self, layer, moe_runner_config)
    from sglang.srt.layers.moe.utils import get_moe_a2a_backend, resolve_moe_runner_backend

    cfg = moe_runner_config
    unsupported = {
        "activation": (cfg.activation, "silu"),
        "is_gated": (cfg.is_gated, True),
        "apply_router_weight_on_input": (cfg.apply_router_weight_on_input, False),
        "gemm1_alpha": (cfg.gemm1_alpha, None),
        "gemm1_clamp_limit": (cfg.gemm1_clamp_limit, None),
        "swiglu_limit": (cfg.swiglu_limit, None),
    }
    for name, (got, want) in unsupported.items():
        if got != want:
            raise NotImplementedError(f"--moe-runner-backend {BACKEND_NAME}: MoE {name} must be {want!r}, got {got!r}")
    a2a = get_moe_a2a_backend()
    if not a2a.is_none():
        raise NotImplementedError(
            f"--moe-runner-backend {BACKEND_NAME} needs --moe-a2a-backend none (standard dispatch), got {a2a.value}"
        )
    self.moe_runner_config = moe_runner_config
    self._moe_runner_backend = resolve_moe_runner_backend(BACKEND_NAME)
    self.runner = None


def _to_local_experts(scale: torch.Tensor, layer) -> torch.Tensor:
    """An input scale [E_global, ...] (or already [E_local, ...], or a scalar) -> [E_local, ...] fp32."""
    scale = scale.detach().float()
    local, total = layer.num_local_experts, layer.num_experts
    if scale.dim() == 0:
        return scale.expand(local).contiguous()
    if scale.shape[0] == local:
        return scale.contiguous()
    if scale.shape[0] == total:
        start = layer.moe_ep_rank * local
        return scale[start : start + local].contiguous()
    raise ValueError(
        f"input scale: expected dim 0 of {total} (all experts) or {local} (local), got {tuple(scale.shape)}"
    )


def _check_path(path: str, layer) -> None:
    """w4a4 forced: refuse now, at load time, off SM12x (the op would refuse at the first request)."""
    if path != "w4a4":
        return
    from sglang_glm5.w4a4_select import resolve_path

    num_experts, two_i, half_h = layer.w13_weight.shape
    shape = (num_experts, 2 * half_h, two_i // 2)
    resolve_path(path, layer.w13_weight.device, float("inf"), shape, has_input_scales=True)


def process_weights_hook(original, self, layer):
    if not _cached(self):
        return original(self, layer)
    from sglang_glm5.nvfp4 import unswizzle_scales

    path = moe_path_from_env()
    _check_path(path, layer)
    # The stock code pairs the input scales with the local experts' weight scales; under expert
    # parallelism the checkpoint's are global-sized. Hand it local slices, then put the originals
    # back (the loader writes global-sized input scales on a weight reload).
    names = ("w13_input_scale", "w2_input_scale")
    global_params = {name: getattr(layer, name) for name in names}
    local = {name: _to_local_experts(p.data, layer) for name, p in global_params.items()}
    for name in names:
        setattr(layer, name, torch.nn.Parameter(local[name], requires_grad=False))
    try:
        original(self, layer)
    finally:
        for name, param in global_params.items():
            setattr(layer, name, param)

    # Block scales: the stock code swizzles them in place when the swizzled shape equals the linear
    # one (rows a multiple of 128, scale columns of 4): then the swizzled alias *is* the weight_scale
    # parameter. Un-swizzle in place (no second copy); otherwise weight_scale was left linear.
    for prefix in ("w13", "w2"):
        scale = getattr(layer, f"{prefix}_weight_scale")
        if getattr(layer, f"{prefix}_blockscale_swizzled", None) is scale:
            rows, cols = scale.shape[-2], scale.shape[-1]
            scale.data.copy_(unswizzle_scales(scale.data, rows, cols).reshape(scale.shape))
    from sglang_glm5.weights import Nvfp4MoeWeights

    # The Parameters themselves, not .data snapshots: a later rebind of a parameter's data (a reload of
    # another shape, CPU offload) is what the bundle then reads.
    weights = Nvfp4MoeWeights.build(
        layer.w13_weight, layer.w13_weight_scale, layer.w13_weight_scale_2, layer.w2_weight,
        layer.w2_weight_scale, layer.w2_weight_scale_2,
        w13_order="up_gate" if self.load_up_proj_weight_first else "gate_up",
        w13_input_scale=local["w13_input_scale"], w2_input_scale=local["w2_input_scale"],
    )  # fmt: skip
    # Codes and block scales re-encoded in place for the W4A16 decode, no second copy of the layer; a layer
    # that may take W4A4 (forced, or tuned for it on this GPU) keeps the checkpoint's, which W4A4 reads.
    from sglang_glm5.w4a4_select import may_take_w4a4

    w4a4 = may_take_w4a4(path, layer.w13_weight.device, weights.shape, has_input_scales=weights.has_input_scales)
    weights = weights.for_device(in_place=True, w4a4=w4a4)
    setattr(layer, WEIGHTS_ATTR, weights)
    setattr(layer, MOE_PATH_ATTR, path)
    logger.debug("sglang-glm5: prepared NVFP4 MoE layer for %s (%s, path %s)", BACKEND_NAME, weights.w13_order, path)


def restore_hook(original, self, layer):
    """Before SGLang loads weights again (a weight update; ``DefaultModelLoader.restore_weights_before_loading``):
    the layer's codes and block scales back in the checkpoint's layout, in place, so that the tensors an update
    rewrites and those it leaves agree when ``process_weights_after_loading`` runs again."""
    weights = getattr(layer, WEIGHTS_ATTR, None)
    if _cached(self) and weights is not None and weights.layout != "checkpoint":
        setattr(layer, WEIGHTS_ATTR, weights.converted("checkpoint", in_place=True))
    return original(self, layer)


def apply_hook(original, self, layer, dispatch_output):
    if not _cached(self):
        return original(self, layer, dispatch_output)
    from sglang.srt.layers.moe.token_dispatcher.standard import StandardCombineInput

    from sglang_glm5.moe import fused_moe

    if getattr(dispatch_output, "hidden_states_scale", None) is not None:
        raise NotImplementedError(
            f"--moe-runner-backend {BACKEND_NAME} takes bf16/fp16 activations; got FP4-quantized ones "
            "(unset SGLANG_MOE_NVFP4_DISPATCH)"
        )
    topk = dispatch_output.topk_output
    out = fused_moe(
        dispatch_output.hidden_states,
        getattr(layer, WEIGHTS_ATTR),  # checked once, in process_weights_after_loading
        topk.topk_weights.float(),  # routed scaling already in (see the module docstring)
        topk.topk_ids,
        path=getattr(layer, MOE_PATH_ATTR),
        check_ids=False,  # SGLang's top-k gives ids in [-1, E) by construction; the check would sync
        num_global_experts=layer.num_experts,  # other ranks' experts come as -1 (expert parallelism)
    )
    return StandardCombineInput(hidden_states=out)


HOOKS = (
    MethodHook(Symbol(f"{_METHOD}.__init__", ("self", "quant_config")), init_hook),
    MethodHook(Symbol(f"{_METHOD}.create_moe_runner", ("self", "layer", "moe_runner_config")), create_moe_runner_hook),
    MethodHook(Symbol(f"{_METHOD}.process_weights_after_loading", ("self", "layer")), process_weights_hook),
    MethodHook(Symbol(f"{_METHOD}.restore_weights_before_loading", ("self", "layer")), restore_hook),
    MethodHook(Symbol(f"{_METHOD}.apply", ("self", "layer", "dispatch_output")), apply_hook),
)

# Read, not hooked: the stock ones do what nvfp4_triton needs once create_moe_runner cached the backend.
SYMBOLS = (
    Symbol(f"{_METHOD}.get_moe_runner_backend", ("self", "layer")),
    Symbol(f"{_METHOD}.load_up_proj_weight_first"),
    Symbol(f"{_MQ}.get_platform", ()),
    Symbol("sglang.srt.layers.moe.utils.get_moe_runner_backend", ()),
    Symbol("sglang.srt.layers.moe.utils.get_moe_a2a_backend", ()),
    Symbol("sglang.srt.layers.moe.token_dispatcher.standard.StandardCombineInput"),
    Symbol("sglang.srt.layers.moe.fused_moe_triton.layer._fuses_routed_scaling_factor_in_topk"),
)
