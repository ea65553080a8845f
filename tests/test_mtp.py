"""MTP (NEXTN speculative decoding) profiles, the [env] table, and what ``plan`` says about MTP and communication.

Every ``serve --mtp`` command parses with SGLang 0.5.23's own ``ServerArgs`` (plugin loaded through
``load_plugins()``), and SGLang's own resolution pipeline (``ServerArgs.resolve_once``: the speculative hook that
aliases NEXTN, picks the draft checkpoint and checks steps / top-k / draft tokens) turns it into the speculative
setup we meant. The pipeline needs a device: it runs with ``--device cpu`` and a GPU of compute capability 12.0
stated for the one check that asks CUDA (``model_hook``); nothing else of the command changes. CPU only.
"""

from __future__ import annotations

import argparse
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_glm5 import cli, serve
from sglang_glm5 import plan as P
from sglang_glm5.profiles import load_profile, mtp_profiles, parse_profile

GIB = 2**30
MTP_PROFILES = ("rtx-pro-6000x8-ep8", "rtx-pro-6000x8-tp8")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    from importlib.resources import files

    folder = tmp_path_factory.mktemp("models") / "GLM-5-NVFP4"
    folder.mkdir()
    (folder / "config.json").write_text((files("sglang_glm5.configs") / "models" / "glm-5.json").read_text())
    return folder


@pytest.fixture(scope="module")
def glm5() -> P.ModelShape:
    return P.load_model_config()[0]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _dry_run(capsys, model_dir: Path, *args: str) -> tuple[list[str], str]:
    """serve --dry-run; (SGLang's argv after ``python -P -m sglang.launch_server``, the environment prefix shown)."""
    rc = cli.main(["serve", "--model", str(model_dir), "--port", str(_free_port()), "--dry-run", *args])
    out = capsys.readouterr().out
    assert rc == 0, out
    shown = shlex.split(out.strip().splitlines()[-1])
    at = shown.index("python")
    assert shown[at : at + 4] == ["python", "-P", "-m", "sglang.launch_server"], shown
    return shown[at + 4 :], " ".join(shown[:at])


@pytest.fixture(scope="module")
def sg(sglang_with_plugin):
    return sglang_with_plugin


def _resolved(prepare, argv: list[str], monkeypatch) -> dict:
    """SGLang's resolution of the command (see the module docstring for --device cpu and the stated GPU)."""
    import torch

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a, **k: (12, 0))
    args = prepare([*argv, "--device", "cpu"])
    args.resolve_once()
    return args.resolved_dict()


@pytest.mark.parametrize("name", MTP_PROFILES)
def test_mtp_profile_parses_and_resolves_as_meant(sg, capsys, model_dir, name, monkeypatch):
    assert set(mtp_profiles()) == set(MTP_PROFILES)
    profile = load_profile(name).with_mtp()
    argv, env = _dry_run(capsys, model_dir, "--profile", name, "--mtp")
    parsed = sg(argv)
    assert parsed.speculative_algorithm == "NEXTN" and parsed.moe_runner_backend == "nvfp4_triton"
    assert (parsed.speculative_num_steps, parsed.speculative_eagle_topk, parsed.speculative_num_draft_tokens) == (
        3, 1, 4
    )  # fmt: skip
    assert parsed.max_running_requests == profile.get("max-running-requests") and parsed.cuda_graph_max_bs_decode == 32
    assert "NCCL_P2P_LEVEL=SYS" in env and "NCCL_MIN_NCHANNELS=8" in env

    got = _resolved(sg, argv, monkeypatch)
    assert got["speculative_algorithm"] == "EAGLE"  # SGLang's alias: NEXTN is EAGLE with the checkpoint's MTP layer
    assert got["speculative_draft_model_path"] == str(model_dir)  # the draft is read from the target checkpoint
    assert (got["speculative_num_steps"], got["speculative_eagle_topk"], got["speculative_num_draft_tokens"]) == (
        3, 1, 4
    )  # fmt: skip
    assert got["speculative_moe_runner_backend"] == "triton" and got["moe_runner_backend"] == "nvfp4_triton"
    assert got["tp_size"] == 8 and got["ep_size"] == profile.get("ep-size")
    assert got["flashinfer_allreduce_fusion_backend"] is None and got["disable_custom_all_reduce"] is True


def test_recipe_draft_tokens_become_steps_plus_one(sg, capsys, model_dir, monkeypatch, glm5):
    """The published recipe's 4 steps / 6 draft tokens / top-k 1: SGLang 0.5.23 runs 5 draft tokens; plan agrees."""
    extra = ["--speculative-num-steps", "4", "--speculative-num-draft-tokens", "6"]
    argv, _ = _dry_run(capsys, model_dir, "--mtp", "--", *extra)
    got = _resolved(sg, argv, monkeypatch)
    assert (got["speculative_num_steps"], got["speculative_num_draft_tokens"]) == (4, 5)
    plan = P.make_plan(load_profile("rtx-pro-6000x8-ep8").with_mtp(), glm5, overrides={"speculative-num-steps": "4"})
    assert (plan.spec_steps, plan.spec_draft_tokens) == (4, 5)


def test_without_mtp_nothing_speculative(sg, capsys, model_dir, monkeypatch):
    argv, _ = _dry_run(capsys, model_dir)
    got = _resolved(sg, argv, monkeypatch)
    assert got["speculative_algorithm"] is None and "--speculative-algorithm" not in argv


# ---------------------------------------------------------------------------------------------------------------
# plan: the MTP layer's memory, by hand. GLM-5's MTP layer is one decoder layer in BF16.
# Routed experts: 256 x 3 x 6144 x 2048 weights x 2 bytes = 19,327,352,832 (the "about 19 GB" of the checkpoint);
# 1/8 per GPU under EP8 (32 whole experts) and TP8 (each expert's intermediate dim / 8): 2,415,919,104 bytes.
MTP_EXPERTS = 256 * 3 * 6144 * 2048 * 2 // 8
# The rest: attention as one target layer (25,493,504 replicated + 163,577,856 / attention TP weights), the shared
# expert 3 x 6144 x 2048 / 8, router 256 x 6144 (+ fp32 bias 256 x 4 bytes), eh_proj 12288 x 6144 (nn.Linear, on
# every GPU), norms 2 x 6144 + 2048 + 512 + 2 x 128 + enorm, hnorm, shared_head.norm 3 x 6144.
ATTN_REPLICATED, ATTN_SPLIT = 25_493_504, 163_577_856


def mtp_rest(attn_tp: int) -> int:
    attention = (ATTN_REPLICATED + ATTN_SPLIT // attn_tp) * 2
    norms = (2 * 6144 + 2048 + 512 + 2 * 128 + 3 * 6144) * 2
    return attention + 3 * 6144 * 2048 * 2 // 8 + 256 * 6144 * 2 + 256 * 4 + 12288 * 6144 * 2 + norms


@pytest.mark.parametrize("name, attn_tp", [("rtx-pro-6000x8-ep8", 2), ("rtx-pro-6000x8-tp8", 8)])
def test_plan_counts_the_mtp_layer_and_its_kv(glm5, name, attn_tp):
    base = P.make_plan(load_profile(name), glm5)
    mtp = P.make_plan(load_profile(name).with_mtp(), glm5)
    parts = {p.name: p.bytes_per_gpu for p in mtp.parts}
    assert parts["MTP: routed experts (BF16)"] == MTP_EXPERTS == 2_415_919_104
    assert parts["MTP: attention and the rest"] == mtp_rest(attn_tp)
    assert mtp.weights == base.weights + MTP_EXPERTS + mtp_rest(attn_tp)
    # KV: one more layer of the target's per-layer bytes (78 x 1284 -> 79 x 1284 in BF16).
    assert base.kv_bytes_per_token == 78 * 1284 and mtp.kv_bytes_per_token == 79 * 1284
    assert mtp.tokens_per_rank == mtp.kv_pool // (79 * 1284) >= mtp.profile.context  # still fits 96 GB cards
    assert mtp.weights < 0.88 * 95.5 * GIB and mtp.kv_pool < base.kv_pool
    assert (mtp.spec_steps, mtp.spec_draft_tokens) == (3, 4) and (base.spec_steps, base.spec_draft_tokens) == (0, 0)


def test_plan_refuses_mtp_it_cannot_serve(glm5, tmp_path):
    with pytest.raises(ValueError, match="profile h200x8 has no \\[mtp\\] table"):
        load_profile("h200x8").with_mtp()
    no_mtp = P.ModelShape(**{**glm5.__dict__, "mtp_layers": 0})
    with pytest.raises(P.PlanError, match="has no MTP layer"):
        P.make_plan(load_profile("rtx-pro-6000x8-ep8").with_mtp(), no_mtp)
    text = 'description="d"\ngpu="h200"\ngpu_memory_gib=1\ngpus_per_node=1\ncontext=1\n[flags]\n'
    with pytest.raises(ValueError, match="must set speculative-algorithm"):
        parse_profile("x", text + '[mtp]\nspeculative-num-steps = { value = 3, reason = "r" }\n')
    with pytest.raises(ValueError, match="upper-case name with a string value"):
        parse_profile("x", text + '[env]\nNCCL_P2P_LEVEL = { value = 3, reason = "r" }\n')


# Communication per decode step, by hand: hidden 6144 in bf16 = 12,288 bytes per token; ring all-reduce sends
# 2 (n-1)/n of the tensor per GPU, all-gather and reduce-scatter (n-1)/n.
def test_plan_communication_ep8_against_tp8(glm5):
    tp8 = P.make_plan(load_profile("rtx-pro-6000x8-tp8"), glm5)
    ep8 = P.make_plan(load_profile("rtx-pro-6000x8-ep8"), glm5)
    # TP8: per layer an all-reduce of the attention output and one of the MoE / MLP output, over 8 GPUs.
    assert sum(c.calls for c in P.collectives(tp8)) == 2 * 78
    assert sum(c.sent_per_gpu(glm5, 1) for c in P.collectives(tp8)) == pytest.approx(156 * 2 * 7 / 8 * 12288)
    # EP8 with 4 attention DP groups of 2: per layer an all-reduce inside the pair (a quarter of the tokens), an
    # all-gather of all tokens before the MoE and a reduce-scatter after it, over 8 GPUs.
    rows = P.collectives(ep8)
    assert [(c.kind, c.gpus, c.tokens, c.calls) for c in rows] == [
        ("all-reduce", 2, 0.25, 78), ("all-gather", 8, 1.0, 78), ("reduce-scatter", 8, 1.0, 78)
    ]  # fmt: skip
    per_layer = 2 * 1 / 2 * 12288 / 4 + 2 * 7 / 8 * 12288
    assert sum(c.sent_per_gpu(glm5, 64) for c in rows) == pytest.approx(78 * per_layer * 64)
    # The trade: EP8 sends ~57% of TP8's bytes, in 1.5x as many collectives.
    ratio = sum(c.sent_per_gpu(glm5, 64) for c in rows) / sum(c.sent_per_gpu(glm5, 64) for c in P.collectives(tp8))
    assert 0.5 < ratio < 0.6
    # MTP: the verify pass carries 4 tokens per request through all 78 layers; the draft runs its one layer 3 times
    # on 1 token and once (extend) on 4.
    mtp = P.collectives(P.make_plan(load_profile("rtx-pro-6000x8-tp8").with_mtp(), glm5))
    assert sum(c.calls for c in mtp) == 2 * (78 + 3 + 1)
    assert sum(c.sent_per_gpu(glm5, 1) for c in mtp) == pytest.approx(2 * (78 * 4 + 3 + 4) * 2 * 7 / 8 * 12288)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sglang_glm5.cli", *args], capture_output=True, text=True, timeout=60)


def test_plan_cli_mtp():
    out = _cli("plan", "--profile", "rtx-pro-6000x8-tp8", "--mtp")
    assert out.returncode == 0, out.stderr
    assert "MTP: routed experts (BF16)        2.42 GB" in out.stdout and "1 MTP draft layer" in out.stdout
    assert "--speculative-algorithm NEXTN" in out.stdout and "164 collectives per step" in out.stdout
    bad = _cli("plan", "--profile", "h200x8", "--mtp")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and "no [mtp] table" in bad.stderr


# ---------------------------------------------------------------------------------------------------------------
# serve's environment: the profile's [env], overridable by the caller.


def _args(model_dir: Path, **kw) -> argparse.Namespace:
    base = dict(model=str(model_dir), profile="rtx-pro-6000x8-ep8", host="127.0.0.1", port=_free_port(),
                api_key=None, context=None, nnodes=None, node_rank=None, dist_init_addr=None, dry_run=True,
                extra=[], mtp=False)  # fmt: skip
    return argparse.Namespace(**{**base, **kw})


def test_serve_exports_the_profile_env_unless_set(model_dir, monkeypatch):
    monkeypatch.delenv("NCCL_P2P_LEVEL", raising=False)
    monkeypatch.delenv("NCCL_MIN_NCHANNELS", raising=False)
    launch, _ = serve.build(_args(model_dir))
    assert launch.env_changes == {"NCCL_P2P_LEVEL": "SYS", "NCCL_MIN_NCHANNELS": "8"}
    assert launch.env["NCCL_P2P_LEVEL"] == "SYS"
    monkeypatch.setenv("NCCL_P2P_LEVEL", "PHB")  # the caller's value wins
    launch, _ = serve.build(_args(model_dir, mtp=True))
    assert launch.env["NCCL_P2P_LEVEL"] == "PHB" and "NCCL_P2P_LEVEL" not in launch.env_changes
    assert launch.env_changes == {"NCCL_MIN_NCHANNELS": "8"} and "--speculative-algorithm" in launch.argv
    launch, _ = serve.build(_args(model_dir, profile="h200x8"))  # NVLink: no NCCL settings
    assert launch.env_changes == {}
    for name in MTP_PROFILES:
        assert {var.name for var in load_profile(name).env} == {"NCCL_P2P_LEVEL", "NCCL_MIN_NCHANNELS"}
        assert all(len(var.reason) > 40 for var in load_profile(name).env)


def test_every_mtp_flag_has_a_reason():
    for name in MTP_PROFILES:
        profile = load_profile(name)
        assert not profile.mtp and profile.with_mtp().mtp and profile.with_mtp().with_mtp() == profile.with_mtp()
        assert all(len(flag.reason) > 40 for flag in profile.mtp_flags)
        names = [flag.name for flag in profile.with_mtp().flags]
        assert len(names) == len(set(names)), "a flag of both tables appears once"
