"""A model-like pair of SGLang ``FusedMoE`` layers under ``nvfp4_triton``: one NVFP4, one unquantized (BF16, as the MTP
layer of the GLM-5 NVFP4 checkpoints). CPU only, SGLang 0.5.23's real modules.

Both layers are SGLang's own ``FusedMoE``, built with the process configuration published the way SGLang's tests
publish it (``runtime_context.publish``), filled, processed (``process_weights_after_loading``) and run through
``FusedMoE.forward`` (SGLang's standard dispatcher, the quantization method's ``apply``, the combine):

- the NVFP4 layer runs our op (Triton interpreter on the CPU) and matches the float64 reference;
- the unquantized layer runs what SGLang runs for it on this machine: ``UnquantizedFusedMoEMethod`` with the
  Triton runner chosen at construction, whose CPU forward is SGLang's torch-native ``moe_forward_native``
  (``forward_cpu``; the GPU path would call the Triton fused_moe kernel). It is bit-identical to the same layer
  built under a stock backend, matches a float64 reference, and agrees with SGLang's other torch path
  (``fused_moe_forward_native``) to bf16 precision.

The same runs for a draft model: target on a stock backend, ``--speculative-moe-runner-backend nvfp4_triton``, layers
built and run inside SGLang's ``speculative_moe_backend_context`` and ``draft_model_build_scope``.
"""

from __future__ import annotations

import contextlib
import logging

import pytest
import torch

pytest.importorskip("sglang.srt.plugins", reason="SGLang's modules are not installed (scripts/dev_setup.sh)")

from sglang_glm5 import patches  # noqa: E402
from sglang_glm5.patches import layers  # noqa: E402
from sglang_glm5.reference import nvfp4_fused_moe_reference  # noqa: E402
from sglang_glm5.testing import random_layer, random_routing  # noqa: E402

E, H, INTER, TOKENS, TOP_K = 8, 256, 128, 11, 3  # 2 INTER = 256, H/16 = 16: SGLang swizzles NVFP4 scales in place


@pytest.fixture(scope="module")
def sg():
    from sglang.srt.layers.moe import fused_moe_native
    from sglang.srt.layers.moe import utils as moe_utils
    from sglang.srt.layers.moe.fused_moe_triton.layer import FusedMoE
    from sglang.srt.layers.moe.token_dispatcher.standard import StandardDispatchOutput
    from sglang.srt.layers.moe.topk import StandardTopKOutput
    from sglang.srt.layers.quantization.modelopt_quant import ModelOptFp4Config
    from sglang.srt.runtime_context import SpawnRanks, get_parallel, publish, reset_context
    from sglang.srt.server_args import ServerArgs

    @contextlib.contextmanager
    def published(**server_args):
        """SGLang's configuration for this process, as ``sglang.test.test_utils.published_topology`` makes it."""
        reset_context()
        publish(ServerArgs(model_path="dummy", **server_args), role="test", ranks=SpawnRanks(world_rank=0))
        try:
            moe_utils.initialize_moe_config()
            with get_parallel().override(tp_group=None):  # one process: FusedMoE.forward only names the group
                yield
        finally:
            reset_context()

    return type("Sg", (), dict(
        FusedMoE=FusedMoE, TopK=StandardTopKOutput, Fp4Config=ModelOptFp4Config, published=staticmethod(published),
        moe_utils=moe_utils, native=fused_moe_native, DispatchOutput=StandardDispatchOutput,
    ))  # fmt: skip


@pytest.fixture
def plugin_on():
    patches.apply()
    layers.forget_kinds()
    yield
    patches.apply()


def _bf16_experts(gen):
    """Unquantized experts as a checkpoint holds them: gate (w1), up (w3) [E, INTER, H], down (w2) [E, H, INTER]."""

    def w(*shape):
        return (torch.randn(*shape, generator=gen) / shape[-1] ** 0.5).bfloat16()

    return w(E, INTER, H), w(E, INTER, H), w(E, H, INTER)


def _build_unquantized(sg, layer_id, experts):
    layer = sg.FusedMoE(num_experts=E, hidden_size=H, intermediate_size=INTER, layer_id=layer_id, top_k=TOP_K,
                        params_dtype=torch.bfloat16, quant_config=None,
                        prefix=f"model.layers.{layer_id}.mlp.experts")  # fmt: skip
    for e, (gate, up, down) in enumerate(zip(*experts, strict=True)):  # SGLang's own loader: w13 rows, order
        layer.weight_loader(layer.w13_weight, gate, "experts.w13_weight", "w1", e)
        layer.weight_loader(layer.w13_weight, up, "experts.w13_weight", "w3", e)
        layer.weight_loader(layer.w2_weight, down, "experts.w2_weight", "w2", e)
    layer.quant_method.process_weights_after_loading(layer)
    return layer


def _build_nvfp4(sg, layer_id, full, input_scales):
    layer = sg.FusedMoE(num_experts=E, hidden_size=H, intermediate_size=INTER, layer_id=layer_id, top_k=TOP_K,
                        params_dtype=torch.bfloat16, quant_config=sg.Fp4Config(True, group_size=16),
                        prefix=f"model.layers.{layer_id}.mlp.experts")  # fmt: skip
    w13, s13 = full.w13, full.w13_scale
    if layer.quant_method.load_up_proj_weight_first:  # the loader's row order for this backend
        w13, s13 = torch.cat([w13[:, INTER:], w13[:, :INTER]], 1), torch.cat([s13[:, INTER:], s13[:, :INTER]], 1)
    for name, value in (
        ("w13_weight", w13), ("w13_weight_scale", s13), ("w13_weight_scale_2", full.w13_scale_2),
        ("w2_weight", full.w2), ("w2_weight_scale", full.w2_scale), ("w2_weight_scale_2", full.w2_scale_2),
        ("w13_input_scale", input_scales[0]), ("w2_input_scale", input_scales[1]),
    ):  # fmt: skip
        getattr(layer, name).data.copy_(value)
    layer.quant_method.process_weights_after_loading(layer)
    return layer


def _unquantized_reference(x, experts, weights, ids) -> torch.Tensor:
    """float64: sum over slots of weight * (silu(x Wg^T) * (x Wu^T)) W2^T."""
    gate, up, down = (w.double() for w in experts)
    out = torch.zeros(x.shape, dtype=torch.float64)
    for e in range(E):
        token, slot = torch.nonzero(ids == e, as_tuple=True)
        xe = x[token].double()
        h = torch.nn.functional.silu(xe @ gate[e].T) * (xe @ up[e].T)
        out.index_add_(0, token, (h @ down[e].T) * weights[token, slot].double()[:, None])
    return out


def _errors(y: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    rel = ((y.double() - ref).norm() / ref.norm()).item()
    max_rel = ((y.double() - ref).abs().max() / ref.abs().max()).item()
    return rel, max_rel


class _Spy:
    """Counts calls of SGLang's torch-native MoE forward (the unquantized layer's CPU path)."""

    def __init__(self, native):
        self.calls, self._original = 0, native.moe_forward_native

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self._original(*args, **kwargs)


# (why, server args, whether the layers are a draft model's)
SCOPES = [
    ("the target model under --moe-runner-backend nvfp4_triton", {"moe_runner_backend": "nvfp4_triton"}, False),
    ("a draft model: stock target, --speculative-moe-runner-backend nvfp4_triton",
     {"moe_runner_backend": "triton", "speculative_moe_runner_backend": "nvfp4_triton"}, True),
]  # fmt: skip


@pytest.mark.parametrize("scope", SCOPES, ids=["target", "draft"])
def test_nvfp4_and_unquantized_layers_side_by_side(sg, plugin_on, scope, gen, monkeypatch, caplog):
    _, server_args, draft = scope
    spy = _Spy(sg.native)
    monkeypatch.setattr(sg.native, "moe_forward_native", spy)
    full = random_layer(E, H, INTER, gen)
    input_scales = (torch.rand(E, 2, generator=gen) + 0.5, torch.rand(E, generator=gen) + 0.5)
    experts = _bf16_experts(gen)
    x = torch.randn(TOKENS, H, generator=gen).bfloat16()
    weights, ids = random_routing(TOKENS, E, TOP_K, gen)

    with sg.published(**server_args):
        draft_scope = (sg.moe_utils.speculative_moe_backend_context, sg.moe_utils.draft_model_build_scope)
        with contextlib.ExitStack() as stack:
            for ctx in draft_scope if draft else ():
                stack.enter_context(ctx())
            with caplog.at_level(logging.INFO, logger="sglang_glm5"):
                nvfp4 = _build_nvfp4(sg, 3, full, input_scales)
                bf16 = _build_unquantized(sg, 78, experts)
                bf16_again = _build_unquantized(sg, 79, experts)
            assert sg.moe_utils.get_moe_runner_backend().value == "nvfp4_triton"  # the hook put it back
            y_nvfp4 = nvfp4.forward(x, sg.TopK(weights, ids, None))
            y_bf16 = bf16.forward(x, sg.TopK(weights, ids, None))

    # Each layer got the runner for its quantization, chosen per layer.
    assert type(nvfp4.quant_method).__name__ == "ModelOptNvFp4FusedMoEMethod"
    assert nvfp4.runner_backend.value == "nvfp4_triton" and nvfp4.quant_method.runner is None
    assert type(bf16.quant_method).__name__ == "UnquantizedFusedMoEMethod"
    assert bf16.runner_backend.value == "triton" and type(bf16.runner.runner_core).__name__ == "TritonRunnerCore"
    assert bf16.dispatcher.runner_backend.value == "triton" and bf16.is_draft is draft and nvfp4.is_draft is draft
    # Logged once per kind: two unquantized layers, one line.
    ours = [r.getMessage() for r in caplog.records if r.name.startswith("sglang_glm5")]
    kind = "draft" if draft else "target"
    assert sum("UnquantizedFusedMoEMethod" in m for m in ours) == 1, ours
    nvfp4_line = f"sglang-glm5: {kind} MoE layers with ModelOptNvFp4FusedMoEMethod run on our NVFP4 op"
    assert any(m.startswith(nvfp4_line) for m in ours), ours
    assert layers.logged_kinds() == {
        ("ModelOptNvFp4FusedMoEMethod", "nvfp4_triton", draft),
        ("UnquantizedFusedMoEMethod", "triton", draft),
    }
    assert bf16_again.runner_backend.value == "triton"

    # NVFP4: our op against the float64 reference.
    ref = nvfp4_fused_moe_reference(x, *full.args(), weights, ids)
    rel, max_rel = _errors(y_nvfp4, ref)
    print(f"NVFP4 layer against float64: rel {rel:.2e}, max rel {max_rel:.2e}")
    assert y_nvfp4.shape == x.shape and y_nvfp4.dtype == x.dtype
    assert rel < 1e-2 and max_rel < 2e-2, f"NVFP4 layer: rel {rel:.2e}, max rel {max_rel:.2e}"

    # Unquantized: SGLang's own CPU path ran, and gives what SGLang gives under a stock backend, bit for bit.
    assert spy.calls == 1
    with sg.published(moe_runner_backend="triton"):
        stock = _build_unquantized(sg, 78, experts)
        y_stock = stock.forward(x, sg.TopK(weights, ids, None))
    assert spy.calls == 2 and stock.runner_backend.value == "triton"
    assert torch.equal(y_bf16, y_stock)
    rel, max_rel = _errors(y_bf16, _unquantized_reference(x, experts, weights, ids))
    print(f"unquantized layer against float64: rel {rel:.2e}, max rel {max_rel:.2e}")
    assert rel < 1e-2 and max_rel < 2e-2, f"unquantized layer: rel {rel:.2e}, max rel {max_rel:.2e}"
    # SGLang's other torch path (the one torch.compile uses) on the same layer agrees to bf16 precision.
    dispatched = sg.DispatchOutput(x, None, sg.TopK(weights, ids, None))
    rel, max_rel = _errors(y_bf16, sg.native.fused_moe_forward_native(bf16, dispatched).hidden_states.double())
    assert rel < 1e-2 and max_rel < 2e-2, f"against fused_moe_forward_native: rel {rel:.2e}, max rel {max_rel:.2e}"


def test_other_backends_build_layers_untouched(sg, plugin_on, gen):
    """With a stock backend the hook calls SGLang's __init__ as is: no stock override, nothing logged."""
    experts = _bf16_experts(gen)
    with sg.published(moe_runner_backend="flashinfer_cutlass"):
        layer = _build_unquantized(sg, 5, experts)
        assert sg.moe_utils.get_moe_runner_backend().value == "flashinfer_cutlass"
    # SGLang's own choice for an unquantized layer under flashinfer_cutlass (its BF16 CUTLASS path), not ours.
    assert layer.runner_backend.value == "flashinfer_cutlass" and layer.quant_method.load_up_proj_weight_first
    assert layers.logged_kinds() == frozenset()


def test_a_method_that_adopts_our_name_is_refused(sg, plugin_on, monkeypatch):
    """A non-NVFP4 method that ends up with nvfp4_triton as its runner is an error naming the layer, at build time."""
    from sglang.srt.layers.moe import utils as moe_utils
    from sglang.srt.layers.quantization.unquant import UnquantizedFusedMoEMethod

    def adopt(self, layer):
        return moe_utils.resolve_moe_runner_backend("nvfp4_triton")

    monkeypatch.setattr(UnquantizedFusedMoEMethod, "get_moe_runner_backend", adopt)
    with sg.published(moe_runner_backend="nvfp4_triton"):
        with pytest.raises(NotImplementedError, match=r"MoE layer 7 \(UnquantizedFusedMoEMethod\) expected SGLang"):
            sg.FusedMoE(num_experts=E, hidden_size=H, intermediate_size=INTER, layer_id=7, top_k=TOP_K,
                        params_dtype=torch.bfloat16, quant_config=None)  # fmt: skip


def test_fp8_layer_gets_its_stock_runner(sg, plugin_on):
    """An FP8 MoE layer reads the backend in create_moe_runner: without the hook it takes nvfp4_triton for a direct
    kernel it does not have; with it, SGLang's Triton runner (what `auto` gives FP8 block-quantized experts here).
    Built only: SGLang's FP8 MoE forward needs GPU kernels."""
    from sglang.srt.layers.quantization.fp8 import Fp8Config

    from sglang_glm5.patches import hooks

    def build():
        config = Fp8Config(is_checkpoint_fp8_serialized=True, weight_block_size=[128, 128])
        return sg.FusedMoE(num_experts=E, hidden_size=H, intermediate_size=2 * INTER, layer_id=2, top_k=TOP_K,
                           params_dtype=torch.bfloat16, quant_config=config)  # fmt: skip

    with sg.published(moe_runner_backend="nvfp4_triton"):
        layer = build()
        assert type(layer.quant_method).__name__ == "Fp8MoEMethod"
        assert layer.runner_backend.value == "triton" and layer.quant_method.runner is not None
        assert ("Fp8MoEMethod", "triton", False) in layers.logged_kinds()
        hooks.uninstall(layers.HOOKS)
        unhooked = build()
        assert unhooked.runner_backend.value == "nvfp4_triton" and unhooked.quant_method.runner is None
