"""The SGLang plugin against SGLang 0.5.23's real modules (CPU; kernels in the Triton interpreter).

SGLang's modules take ~10 s to import: they are imported once per module (the ``sg`` fixture).
"""

from __future__ import annotations

import logging
import multiprocessing
import sys
from dataclasses import dataclass

import pytest
import torch

pytest.importorskip("sglang.srt.plugins", reason="SGLang's modules are not installed (scripts/dev_setup.sh)")

from sglang_glm5 import patches  # noqa: E402
from sglang_glm5.nvfp4 import swizzle_scales  # noqa: E402
from sglang_glm5.patches import guard, hooks, nvfp4_moe  # noqa: E402
from sglang_glm5.reference import nvfp4_fused_moe_reference  # noqa: E402
from sglang_glm5.testing import random_layer, random_routing  # noqa: E402

MODEL_ARGS = ["--model-path", "/models/GLM-5-NVFP4", "--quantization", "modelopt_fp4"]


@dataclass
class Sg:
    """The SGLang modules the tests use, imported once."""

    plugins: object
    mq: object  # srt.layers.quantization.modelopt_quant
    choices: object
    moe_utils: object
    runner_cfg: type
    dispatcher: type
    topk_output: type
    dispatch_output: type
    combine_input: type
    get_flags: object
    get_parallel: object
    prepare_server_args: object
    fuses_routed_scaling: object


@pytest.fixture(scope="module")
def sg() -> Sg:
    import sglang.srt.plugins as plugins
    from sglang.srt.arg_groups import choices
    from sglang.srt.layers.moe import utils as moe_utils
    from sglang.srt.layers.moe.fused_moe_triton.layer import _fuses_routed_scaling_factor_in_topk
    from sglang.srt.layers.moe.moe_runner.base import MoeRunnerConfig
    from sglang.srt.layers.moe.token_dispatcher.standard import (
        StandardCombineInput,
        StandardDispatcher,
        StandardDispatchOutput,
    )
    from sglang.srt.layers.moe.topk import StandardTopKOutput
    from sglang.srt.layers.quantization import modelopt_quant
    from sglang.srt.runtime_context import get_flags, get_parallel
    from sglang.srt.server_args import prepare_server_args

    return Sg(
        plugins, modelopt_quant, choices, moe_utils, MoeRunnerConfig, StandardDispatcher, StandardTopKOutput,
        StandardDispatchOutput, StandardCombineInput, get_flags, get_parallel, prepare_server_args,
        _fuses_routed_scaling_factor_in_topk,
    )  # fmt: skip


@pytest.fixture
def plugin_on(sg):
    """The plugin applied (idempotent), and applied again after the test whatever it did."""
    patches.apply()
    yield
    patches.apply()


def _method_attrs(sg):
    cls = sg.mq.ModelOptNvFp4FusedMoEMethod
    return {
        name: cls.__dict__[name] for name in ("__init__", "create_moe_runner", "process_weights_after_loading", "apply")
    }


# ---------------------------------------------------------------------------------------------
# Loading through SGLang's own load_plugins(), in this process and in a spawned child.


def test_load_plugins_same_process(sg, monkeypatch):
    patches.undo()
    assert guard.BACKEND_NAME not in sg.choices.MOE_RUNNER_BACKEND_CHOICES
    monkeypatch.setattr(sg.plugins, "_plugins_loaded", False)
    monkeypatch.delenv("SGLANG_PLUGINS", raising=False)
    sg.plugins.load_plugins()
    assert patches.is_applied()
    assert sg.choices.MOE_RUNNER_BACKEND_CHOICES.count(guard.BACKEND_NAME) == 1
    assert sg.moe_utils.resolve_moe_runner_backend(guard.BACKEND_NAME).value == guard.BACKEND_NAME
    for name, fn in _method_attrs(sg).items():
        assert getattr(fn, hooks.MARKER, False), f"{name} not hooked"
    from sglang.srt.layers.moe.fused_moe_triton.layer import FusedMoE

    assert getattr(FusedMoE.__dict__["__init__"], hooks.MARKER, False), "FusedMoE.__init__ not hooked"


def _child_report() -> dict:
    from sglang.srt.arg_groups.choices import MOE_RUNNER_BACKEND_CHOICES
    from sglang.srt.layers.moe.fused_moe_triton.layer import FusedMoE
    from sglang.srt.layers.moe.utils import resolve_moe_runner_backend
    from sglang.srt.layers.quantization.modelopt_quant import ModelOptNvFp4FusedMoEMethod
    from sglang.srt.plugins import load_plugins

    before = "nvfp4_triton" in MOE_RUNNER_BACKEND_CHOICES
    load_plugins()
    import sglang_glm5.patches

    return {
        "before": before,
        "applied": sglang_glm5.patches.is_applied(),
        "choice": "nvfp4_triton" in MOE_RUNNER_BACKEND_CHOICES,
        "resolves": resolve_moe_runner_backend("nvfp4_triton").value,
        "apply_hooked": hasattr(ModelOptNvFp4FusedMoEMethod.apply, "__wrapped__"),
        "layers_hooked": hasattr(FusedMoE.__init__, "__wrapped__"),
    }


def test_load_plugins_in_spawned_child():
    ctx = multiprocessing.get_context("spawn")  # how SGLang starts its scheduler / TP workers
    with ctx.Pool(1) as pool:
        report = pool.apply(_child_report)
    assert report == {
        "before": False, "applied": True, "choice": True, "resolves": "nvfp4_triton", "apply_hooked": True,
        "layers_hooked": True,
    }  # fmt: skip


# ---------------------------------------------------------------------------------------------
# The hooked method on a small layer: create_weights -> fill -> process_weights_after_loading -> apply.


@dataclass(frozen=True)
class Case:
    num_experts: int = 8  # global
    ep_size: int = 1
    ep_rank: int = 0
    hidden: int = 256
    inter: int = 128
    num_tokens: int = 13
    top_k: int = 4


CASES = [
    Case(),  # EP 1: every expert local, scales swizzled in place (2I = 256, H/16 = 16)
    Case(ep_size=4, ep_rank=2, num_tokens=11, top_k=3),  # a rank holding experts 4-5: global ids -> local and -1
    Case(num_experts=4, hidden=96, inter=64, num_tokens=5, top_k=2),  # H/16 = 6 columns: swizzle not in place
]


class _Layer(torch.nn.Module):
    """What the method reads from SGLang's FusedMoE."""

    def __init__(self, sg, case: Case, backend):
        super().__init__()
        local = case.num_experts // case.ep_size
        self.num_experts, self.num_local_experts = case.num_experts, local
        self.moe_ep_size, self.moe_ep_rank = case.ep_size, case.ep_rank
        self.moe_runner_config = sg.runner_cfg(
            num_experts=case.num_experts, num_local_experts=local, hidden_size=case.hidden,
            intermediate_size_per_partition=case.inter, top_k=case.top_k, params_dtype=torch.bfloat16,
            runner_backend=backend, routed_scaling_factor=2.5, num_fused_shared_experts=0,
        )  # fmt: skip
        self.dispatcher = sg.dispatcher(self.moe_runner_config)
        self._mega_moe_nvfp4 = False


def _build(sg, case: Case, backend_name: str, gen, filled=None):
    """Method + layer under `backend_name`, filled with NVFP4 weights; returns (method, layer, filled)."""
    backend = sg.moe_utils.resolve_moe_runner_backend(backend_name)
    with sg.get_flags().moe.override(runner_backend=backend):
        method = sg.mq.ModelOptNvFp4FusedMoEMethod(sg.mq.ModelOptFp4Config(True, group_size=16))
        layer = _Layer(sg, case, backend)
        method.create_weights(
            layer, layer.num_local_experts, case.hidden, case.inter, torch.bfloat16, weight_loader=None
        )
        method.create_moe_runner(layer, layer.moe_runner_config)
        layer.moe_runner_config.runner_backend = method.get_moe_runner_backend(layer)
        if filled is None:
            full = random_layer(case.num_experts, case.hidden, case.inter, gen)
            input_scales = (
                torch.rand(case.num_experts, 2, generator=gen) + 0.5,
                torch.rand(case.num_experts, generator=gen) + 0.5,
            )
            filled = (full, input_scales)
        full, input_scales = filled
        lo = case.ep_rank * layer.num_local_experts
        sl = slice(lo, lo + layer.num_local_experts)
        w13, s13 = full.w13[sl], full.w13_scale[sl]
        if method.load_up_proj_weight_first:  # the loader's row order for this backend
            w13 = torch.cat([w13[:, case.inter :], w13[:, : case.inter]], 1)
            s13 = torch.cat([s13[:, case.inter :], s13[:, : case.inter]], 1)
        for name, value in (
            ("w13_weight", w13), ("w13_weight_scale", s13), ("w13_weight_scale_2", full.w13_scale_2[sl]),
            ("w2_weight", full.w2[sl]), ("w2_weight_scale", full.w2_scale[sl]),
            ("w2_weight_scale_2", full.w2_scale_2[sl]), ("w13_input_scale", input_scales[0]),
            ("w2_input_scale", input_scales[1]),
        ):  # fmt: skip
            getattr(layer, name).data.copy_(value)
        method.process_weights_after_loading(layer)
    return method, layer, filled


@pytest.mark.parametrize(
    "case", CASES, ids=lambda c: f"E{c.num_experts}-ep{c.ep_size}r{c.ep_rank}-H{c.hidden}-I{c.inter}"
)
def test_hooked_method_matches_reference(sg, plugin_on, case: Case, gen, monkeypatch):
    # The dispatcher asks SGLang's platform for the device of its expert map; there is none on a CPU machine.
    monkeypatch.setattr("sglang.srt.layers.moe.token_dispatcher.standard.get_device", lambda *a: "cpu")
    with sg.get_parallel().override(moe_ep_size=case.ep_size, moe_ep_rank=case.ep_rank):
        method, layer, (full, input_scales) = _build(sg, case, "nvfp4_triton", gen)
        assert method.runner is None and method.get_moe_runner_backend(layer).value == "nvfp4_triton"
        # Top-k weights carry routed_scaling_factor for this method: the op must not apply it again.
        assert sg.fuses_routed_scaling(method, method.get_moe_runner_backend(layer))

        local = layer.num_local_experts
        sl = slice(case.ep_rank * local, (case.ep_rank + 1) * local)
        swizzle_fits = 2 * case.inter % 128 == 0 and (case.hidden // 16) % 4 == 0
        # In place: SGLang made the swizzled alias the weight_scale parameter; the plugin un-swizzled it.
        assert (layer.w13_blockscale_swizzled is layer.w13_weight_scale) == swizzle_fits
        assert torch.equal(layer.w13_weight_scale.view(torch.uint8), full.w13_scale[sl].view(torch.uint8))
        assert torch.equal(layer.w2_weight_scale.view(torch.uint8), full.w2_scale[sl].view(torch.uint8))
        if not swizzle_fits:  # left linear, and SGLang's own swizzled copy is untouched
            want = swizzle_scales(full.w13_scale[sl]).view(torch.uint8)
            assert torch.equal(layer.w13_blockscale_swizzled.view(torch.uint8), want)
        bundle = getattr(layer, nvfp4_moe.WEIGHTS_ATTR)  # checked once; the layer's own tensors, no copies
        assert bundle.w13_order == "gate_up" and bundle.w13 is layer.w13_weight  # the Parameter, no snapshot
        assert bundle.w13_scale is layer.w13_weight_scale
        assert bundle.w2_scale_2.data_ptr() == layer.w2_weight_scale_2.data_ptr()
        assert torch.equal(bundle.a1, input_scales[0][sl].max().reshape(1))
        assert torch.equal(bundle.a2, input_scales[1][sl])
        assert layer.w13_input_scale.shape == (case.num_experts, 2)  # the loader's global-sized parameter is back

        # Global routing -> SGLang's own dispatcher maps to local ids (-1: another rank's expert).
        x = torch.randn(case.num_tokens, case.hidden, generator=gen).bfloat16()
        weights, global_ids = random_routing(case.num_tokens, case.num_experts, case.top_k, gen)
        with sg.get_flags().moe.override(runner_backend=method.get_moe_runner_backend(layer)):
            dispatched = layer.dispatcher.dispatch(x, sg.topk_output(weights, global_ids, None))
        assert isinstance(dispatched, sg.dispatch_output)
        ids = dispatched.topk_output.topk_ids
        in_rank = (global_ids >= sl.start) & (global_ids < sl.stop)
        assert torch.equal(ids.long(), torch.where(in_rank, global_ids - sl.start, -1).long())
        if case.ep_size > 1:
            assert bool((ids == -1).any()) and bool((ids >= 0).any())

        out = method.apply(layer, dispatched)
        assert isinstance(out, sg.combine_input)
        args = (
            full.w13[sl],
            full.w13_scale[sl],
            full.w13_scale_2[sl],
            full.w2[sl],
            full.w2_scale[sl],
            full.w2_scale_2[sl],
        )
        ref = nvfp4_fused_moe_reference(x, *args, weights, ids)
        y = out.hidden_states
        assert y.shape == x.shape and y.dtype == x.dtype
        rel = ((y.double() - ref).norm() / ref.norm()).item()
        max_rel = ((y.double() - ref).abs().max() / ref.abs().max()).item()
        assert rel < 1e-2 and max_rel < 2e-2, f"rel {rel:.2e}, max rel {max_rel:.2e}"


# ---------------------------------------------------------------------------------------------
# Any other backend: SGLang's own behaviour and weights.


class _RecordingRunner:
    def __init__(self):
        self.calls = []

    def run(self, dispatch_output, quant_info):
        self.calls.append(quant_info)
        return "stock apply"


def _bit_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (
        a.dtype == b.dtype
        and a.shape == b.shape
        and torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))
    )


def _snapshot(method, layer) -> dict:
    state = {name: p.detach().clone() for name, p in layer.named_parameters()}
    state["_backend"] = method.get_moe_runner_backend(layer).value
    state["_up_first"] = method.load_up_proj_weight_first
    state["_runner"] = type(method.runner).__name__
    state["_aliases"] = layer.w13_blockscale_swizzled is layer.w13_weight_scale
    state["_plugin_attrs"] = [a for a in (nvfp4_moe.WEIGHTS_ATTR, nvfp4_moe.MOE_PATH_ATTR) if hasattr(layer, a)]
    return state


def test_flashinfer_cutlass_is_stock(sg, plugin_on, gen, monkeypatch):
    # The stock NVFP4 check wants Blackwell for flashinfer_cutlass: pretend, for both runs.
    real_platform = sg.mq.get_platform()
    monkeypatch.setattr(sg.mq, "get_platform", lambda: nvfp4_moe._PlatformPassingNvfp4Check(real_platform))
    case = Case(num_experts=4, num_tokens=3, top_k=2)
    with sg.get_parallel().override(moe_ep_size=1, moe_ep_rank=0):
        hooked_method, hooked_layer, filled = _build(sg, case, "flashinfer_cutlass", gen)
        patches.undo()
        assert not hasattr(sg.mq.ModelOptNvFp4FusedMoEMethod.apply, "__wrapped__")
        stock_method, stock_layer, _ = _build(sg, case, "flashinfer_cutlass", gen, filled)
        patches.apply()
    cutlass = sg.moe_utils.resolve_moe_runner_backend("flashinfer_cutlass")
    with sg.get_flags().moe.override(runner_backend=cutlass):
        hooked, stock = _snapshot(hooked_method, hooked_layer), _snapshot(stock_method, stock_layer)
    assert hooked.keys() == stock.keys()
    for key in stock:
        if isinstance(stock[key], torch.Tensor):
            assert _bit_equal(stock[key], hooked[key]), key
        else:
            assert stock[key] == hooked[key], key
    assert stock["_up_first"] is True and stock["_plugin_attrs"] == []
    # apply goes to the stock flashinfer_cutlass branch, which hands SGLang's runner the same quant info.
    x = torch.randn(3, case.hidden, generator=gen).bfloat16()
    weights, ids = random_routing(3, case.num_experts, case.top_k, gen)
    dispatched = sg.dispatch_output(x, None, sg.topk_output(weights, ids, None))
    for method, layer in ((hooked_method, hooked_layer), (stock_method, stock_layer)):
        method.runner = _RecordingRunner()
        with sg.get_flags().moe.override(runner_backend=cutlass):
            assert method.apply(layer, dispatched) == "stock apply"
    (q_hooked,), (q_stock,) = hooked_method.runner.calls, stock_method.runner.calls
    assert type(q_hooked).__name__ == "FlashInferCutlassMoeQuantInfo" and q_hooked.quant_type == q_stock.quant_type
    assert all(_bit_equal(a, b) for a, b in zip(q_hooked.quant_scales, q_stock.quant_scales, strict=True))


# ---------------------------------------------------------------------------------------------
# ServerArgs, the switch, the version guard, moved symbols, idempotence.


def test_server_args_accept_backend_only_with_plugin(sg, plugin_on, monkeypatch):
    args = sg.prepare_server_args([*MODEL_ARGS, "--moe-runner-backend", "nvfp4_triton"])
    assert args.moe_runner_backend == "nvfp4_triton"
    patches.undo()
    monkeypatch.setenv(guard.DISABLE_ENV, "1")
    patches.plugin()  # disabled: changes nothing
    assert not patches.is_applied() and guard.BACKEND_NAME not in sg.choices.MOE_RUNNER_BACKEND_CHOICES
    with pytest.raises(SystemExit):  # argparse: invalid choice
        sg.prepare_server_args([*MODEL_ARGS, "--moe-runner-backend", "nvfp4_triton"])
    assert sg.prepare_server_args([*MODEL_ARGS, "--moe-runner-backend", "flashinfer_cutlass"]).moe_runner_backend


def test_version_guard_with_another_version(sg, plugin_on, monkeypatch, caplog):
    patches.undo()
    stock = _method_attrs(sg)
    monkeypatch.setattr(guard, "installed_sglang_version", lambda: "0.5.99")
    monkeypatch.setattr(sg.plugins, "_plugins_loaded", False)
    monkeypatch.setattr(sys, "argv", ["sglang.launch_server", *MODEL_ARGS])
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="sglang_glm5"):
        sg.plugins.load_plugins()
    ours = [r for r in caplog.records if r.name.startswith("sglang_glm5")]
    assert len(ours) == 1 and "0.5.99" in ours[0].getMessage() and "0.5.23" in ours[0].getMessage()
    assert _method_attrs(sg) == stock and guard.BACKEND_NAME not in sg.choices.MOE_RUNNER_BACKEND_CHOICES

    # Asking for the backend stops the launcher in load_plugins(), with the supported versions named.
    monkeypatch.setattr(sg.plugins, "_plugins_loaded", False)
    monkeypatch.setattr(sys, "argv", ["sglang.launch_server", *MODEL_ARGS, "--moe-runner-backend=nvfp4_triton"])
    with pytest.raises(SystemExit) as exc:
        sg.plugins.load_plugins()
    assert "0.5.23" in str(exc.value) and "0.5.99" in str(exc.value) and "nvfp4_triton" in str(exc.value)


def test_moved_symbol_is_an_error_naming_it(sg, plugin_on, monkeypatch):
    patches.undo()
    stock = _method_attrs(sg)
    moved = hooks.Symbol(f"{sg.mq.__name__}.ModelOptNvFp4FusedMoEMethod.apply_moved", ("self",))
    with_moved = (*nvfp4_moe.HOOKS, hooks.MethodHook(moved, nvfp4_moe.apply_hook))
    with pytest.raises(patches.PatchTargetError, match="ModelOptNvFp4FusedMoEMethod.apply_moved"):
        patches.apply(with_hooks=with_moved)
    assert _method_attrs(sg) == stock and guard.BACKEND_NAME not in sg.choices.MOE_RUNNER_BACKEND_CHOICES
    monkeypatch.undo()

    def create_moe_runner(self, layer, config, extra):  # a changed signature
        raise AssertionError("never called")

    monkeypatch.setattr(sg.mq.ModelOptNvFp4FusedMoEMethod, "create_moe_runner", create_moe_runner)
    with pytest.raises(patches.PatchTargetError, match=r"create_moe_runner: expected parameters"):
        patches.apply()
    assert sg.mq.ModelOptNvFp4FusedMoEMethod.__dict__["create_moe_runner"] is create_moe_runner


def test_apply_is_idempotent_and_undoable(sg, plugin_on):
    patches.undo()
    stock = _method_attrs(sg)
    patches.apply()
    patches.apply()
    hooked = _method_attrs(sg)
    for name, fn in hooked.items():
        assert fn.__wrapped__ is stock[name], f"{name} wrapped twice"
    assert sg.choices.MOE_RUNNER_BACKEND_CHOICES.count(guard.BACKEND_NAME) == 1
    patches.undo()
    assert _method_attrs(sg) == stock
    with pytest.raises(ValueError, match="neither built in nor registered"):
        sg.moe_utils.resolve_moe_runner_backend(guard.BACKEND_NAME)


@pytest.mark.parametrize(
    "argv, asked",
    [
        (["--moe-runner-backend", "nvfp4_triton"], True),
        (["--moe-runner-backend=nvfp4_triton"], True),
        (["--speculative-moe-runner-backend", "nvfp4_triton"], True),
        (["--moe-runner-backend", "flashinfer_cutlass"], False),
        (["--moe-runner-backend"], False),  # a dangling flag
        (["--model-path", "nvfp4_triton"], False),  # the name elsewhere on the line
    ],
)
def test_backend_requested(argv, asked):
    assert guard.backend_requested(argv) is asked
