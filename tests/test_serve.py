"""``sglang-glm5 serve`` and ``scripts/launch_server.sh``: every profile's command parses with SGLang 0.5.23's own
``ServerArgs`` parser (plugin loaded through SGLang's ``load_plugins()``), bad input is one clear line. CPU only.

SGLang's modules take ~10 s to import: once per module (the ``sg`` fixture).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import socket
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from sglang_glm5 import cli, serve
from sglang_glm5.plan import load_model_config
from sglang_glm5.profiles import DEFAULT_PROFILE as DEFAULT
from sglang_glm5.profiles import load_profile, profile_names

REPO = Path(__file__).resolve().parent.parent
LAUNCHER = ["python", "-P", "-m", "sglang.launch_server"]
MULTI_NODE = ["--node-rank", "0", "--dist-init-addr", "10.0.0.1:50000"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """A fake GLM-5 model folder: just the config.json (no weights)."""
    from importlib.resources import files

    folder = tmp_path_factory.mktemp("models") / "GLM-5-NVFP4"
    folder.mkdir()
    config = json.loads((files("sglang_glm5.configs") / "models" / "glm-5.json").read_text())
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _dry_run(capsys, model_dir: Path, *args: str) -> list[str]:
    """serve --dry-run in this process; the printed command as argv (without ``python -m sglang.launch_server``)."""
    rc = cli.main(["serve", "--model", str(model_dir), "--port", str(_free_port()), "--dry-run", *args])
    out = capsys.readouterr().out
    assert rc == 0, out
    argv = _command(out)
    assert argv[:4] == LAUNCHER, argv
    return argv[4:]


def _command(out: str) -> list[str]:
    """The printed command (the last line) as argv, without the environment it sets (NAME=value in front)."""
    argv = shlex.split(out.strip().splitlines()[-1])
    while argv and "=" in argv[0] and not argv[0].startswith("-"):
        argv.pop(0)
    return argv


# ---------------------------------------------------------------------------------------------------------------
# Against SGLang's own parser.


@pytest.fixture(scope="module")
def sg(sglang_with_plugin):
    """SGLang's argument parser with the plugin loaded the way SGLang loads it (load_plugins)."""
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    return sglang_with_plugin, {opt: action for action in parser._actions for opt in action.option_strings}


def _check_round_trip(sg, argv: list[str]) -> object:
    """Parse with SGLang; every flag we pass comes back as the value we meant."""
    prepare, actions = sg
    args = prepare(argv)  # SystemExit on a flag SGLang does not know, or a value it refuses
    for i, token in enumerate(argv):
        if not token.startswith("--"):
            continue
        flag, eq, inline = token.partition("=")
        action = actions[flag]
        if action.nargs == 0:
            assert getattr(args, action.dest) is True, token
        else:
            raw = inline if eq else argv[i + 1]
            want = action.type(raw) if callable(action.type) else raw
            assert getattr(args, action.dest) == want, (token, getattr(args, action.dest), want)
    return args


@pytest.mark.parametrize("name", ["rtx-pro-6000x8-ep8", "rtx-pro-6000x8-tp8", "rtx-pro-6000x16-ep16", "h200x8"])
def test_every_profile_parses_with_sglang(sg, capsys, model_dir, name):
    profile = load_profile(name)
    argv = _dry_run(capsys, model_dir, "--profile", name, *(MULTI_NODE if profile.nnodes > 1 else []))
    args = _check_round_trip(sg, argv)
    assert (args.tp_size, args.ep_size) == (profile.get("tp-size"), profile.get("ep-size"))
    assert args.attn_dp_size == profile.get("attn-dp-size", 1) and args.dp_size == 1
    assert args.moe_runner_backend == "nvfp4_triton" and args.quantization == "modelopt_fp4"
    assert args.disable_shared_experts_fusion and args.kv_cache_dtype == profile.get("kv-cache-dtype")
    assert args.cuda_graph_max_bs_decode == profile.get("cuda-graph-max-bs-decode")
    assert args.max_running_requests == profile.get("max-running-requests")
    assert args.context_length == profile.context and args.host == "127.0.0.1"
    assert args.model_path == str(model_dir) and args.nnodes == profile.nnodes
    if profile.nnodes > 1:
        assert (args.node_rank, args.dist_init_addr) == (0, "10.0.0.1:50000")
    assert name in profile_names()


def test_a_flag_sglang_does_not_know_fails_in_the_dry_run(sg, capsys, model_dir):
    port = str(_free_port())
    rc = cli.main(["serve", "--model", str(model_dir), "--port", port, "--dry-run", "--", "--no-such-flag"])
    assert rc == 2 and capsys.readouterr().out == ""  # no command printed
    launch, _ = serve.build(_serve_args(model_dir, extra=["--disable-radix-cache"]))  # a flag it knows passes
    assert _check_round_trip(sg, launch.argv[4:]).disable_radix_cache is True


# Safe overrides after --: the value replaces the profile's, the plan is redone, SGLang parses the result.
OVERRIDES = [
    # (why, extra args, ServerArgs field, expected)
    ("the stock baseline of scripts/run_loadtest.sh", ["--moe-runner-backend", "flashinfer_cutlass"],
     "moe_runner_backend", "flashinfer_cutlass"),
    ("FP8 KV, opt-in on SM120", ["--kv-cache-dtype=fp8_e4m3"], "kv_cache_dtype", "fp8_e4m3"),
    ("attention DP 8, the well-trodden DeepSeek layout", ["--attn-dp-size", "8"], "attn_dp_size", 8),
    ("a smaller decode graph", ["--cuda-graph-max-bs-decode", "64"], "cuda_graph_max_bs_decode", 64),
    ("the same layout value again is no conflict", ["--tp-size", "8"], "tp_size", 8),
    ("run_loadtest.sh passes the API key after --", ["--api-key", "sek"], "api_key", "sek"),
]  # fmt: skip


@pytest.mark.parametrize("case", OVERRIDES, ids=[c[0] for c in OVERRIDES])
def test_safe_overrides(sg, capsys, model_dir, case, monkeypatch):
    _, extra, field, want = case
    launch, _ = serve.build(_serve_args(model_dir, extra=extra))
    argv = launch.argv[4:]
    args = _check_round_trip(sg, argv)
    assert getattr(args, field) == want
    flag = extra[0].split("=")[0]
    assert sum(t.split("=")[0] == flag for t in argv) == 1, f"{flag} appears once: {argv}"


def test_serve_aliases_are_sglangs(sg):
    _, actions = sg
    for alias, name in serve.ALIASES.items():
        assert actions[f"--{alias}"] is actions[f"--{name}"], alias


# ---------------------------------------------------------------------------------------------------------------
# Bad input: one line on stderr, exit status 2, no traceback (the CLI in a subprocess).


def _serve(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "sglang_glm5.cli", "serve", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)


def test_bad_input_is_one_clear_line(sg, model_dir, capsys):
    model = ["--model", str(model_dir), "--dry-run"]
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = str(busy.getsockname()[1])
        cases = [
            # (why, serve args, text in the error)
            ("unknown profile", [*model, "--profile", "rtx-9000"], "unknown profile 'rtx-9000'; expected one of"),
            ("missing model path", ["--model", "/nonexistent/GLM-5", "--dry-run"], "/nonexistent/GLM-5: no such"),
            ("a folder without config.json", ["--model", str(model_dir.parent), "--dry-run"], "no config.json"),
            ("a port in use", [*model, "--port", port], f"--port {port} on 127.0.0.1 is not free"),
            ("another tp size than the profile's EP layout", [*model, "--", "--tp-size", "4"],
             "--tp-size 4 (after --) conflicts with profile rtx-pro-6000x8-ep8 (tp 8, ep 8"),
            ("another ep size, SGLang's alias", [*model, "--", "--ep=4"], "--ep=4 (after --) conflicts"),
            ("another quantization", [*model, "--", "--quantization", "fp8"], "quantization fp8 (after --) conflicts"),
            ("data-parallel replicas", [*model, "--", "--dp-size", "2"], "--dp-size 2 (after --) conflicts"),
            ("the port belongs to serve", [*model, "--", "--port", "1234"], "give it to serve as --port, before --"),
            ("an override that does not fit", [*model, "--", "--mem-fraction-static", "0.6"], "short by"),
            ("attn-dp must divide tp", [*model, "--", "--attn-dp-size", "3"], "attn-dp-size 3 must divide --tp-size 8"),
            ("two-node profile without a rendezvous", [*model, "--profile", "rtx-pro-6000x16-ep16"],
             "runs on 2 nodes: pass --node-rank"),
            ("a stray value", [*model, "--", "oops"], "'oops' after -- is not a --flag"),
        ]  # fmt: skip
        # The command in this process (SGLang imported once: a fresh interpreter takes seconds a case); an error
        # that is not the one-line kind would raise here. The last case also runs as a user runs it, in a subprocess.
        for why, args, text in cases:
            assert cli.main(["serve", *args]) == 2, why
            out, err = capsys.readouterr()
            lines = err.strip().splitlines()
            assert out == "" and len(lines) == 1, (why, lines)
            assert lines[0].startswith("sglang-glm5 serve: ") and text in lines[0], (why, lines)
        alone = _serve(*cases[-1][1])
        assert alone.returncode == 2 and alone.stdout == "" and "Traceback" not in alone.stderr, alone.stderr
        assert alone.stderr.strip() == lines[0], (alone.stderr, lines)


def test_plugin_environment(model_dir, monkeypatch):
    monkeypatch.setenv("SGLANG_GLM5_DISABLE", "1")
    with pytest.raises(ValueError, match="SGLANG_GLM5_DISABLE is set"):
        serve.build(_serve_args(model_dir))
    launch, _ = serve.build(_serve_args(model_dir, extra=["--moe-runner-backend", "flashinfer_cutlass"]))  # baseline
    monkeypatch.delenv("SGLANG_GLM5_DISABLE")
    monkeypatch.setenv("SGLANG_PLUGINS", "other")
    launch, _ = serve.build(_serve_args(model_dir))
    assert launch.env["SGLANG_PLUGINS"] == "other,sglang_glm5" and launch.env_changes == {
        "SGLANG_PLUGINS": "other,sglang_glm5",
        **{var.name: var.value for var in load_profile(DEFAULT).env},
    }
    shown = serve.shown_command(launch)
    assert shown.startswith("SGLANG_PLUGINS=other,sglang_glm5 NCCL_") and " python -P -m sglang.launch_server" in shown


def test_serve_execs_the_launcher_and_hides_the_key(model_dir, monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(os, "execvpe", lambda path, argv, env: calls.append((path, argv, env)))
    monkeypatch.setenv(serve.API_KEY_ENV, "secret-key")
    rc = cli.main(["serve", "--model", str(model_dir), "--port", str(_free_port())])
    out = capsys.readouterr().out
    assert rc == 0 and len(calls) == 1
    path, argv, env = calls[0]
    assert path == sys.executable and argv[:4] == [sys.executable, "-P", "-m", "sglang.launch_server"]
    assert argv[argv.index("--api-key") + 1] == "secret-key"
    assert "secret-key" not in out and "--api-key '<redacted>'" in out
    assert argv[argv.index("--host") + 1] == "127.0.0.1"


def _serve_args(model_dir: Path, extra: list[str] | None = None, **kw) -> argparse.Namespace:
    base = dict(model=str(model_dir), profile="rtx-pro-6000x8-ep8", host="127.0.0.1", port=_free_port())
    base |= dict(api_key=None, context=None, nnodes=None, node_rank=None, dist_init_addr=None, dry_run=True)
    base["extra"] = extra or []
    base.update(kw)
    return argparse.Namespace(**base)


# Options that would have been dropped or overridden without a word (each once did).
SILENT = [
    # (why, serve options, extra args, text in the error)
    ("an empty key after -- would leave the server open", {}, ["--api-key"], "expected a key after it"),
    ("the same as --api-key=", {}, ["--api-key="], "expected a key after it"),
    ("an empty --api-key of serve's own", {"api_key": ""}, [], "--api-key: expected a key, got an empty one"),
    ("two contexts", {"context": 4096}, ["--context-length", "8192"], "and --context 4096: give the context once"),
    ("a rendezvous on a one-node profile", {"dist_init_addr": "10.0.0.1:5000"}, [], "runs on one node"),
]  # fmt: skip


@pytest.mark.parametrize("case", SILENT, ids=[c[0] for c in SILENT])
def test_options_that_would_be_lost_are_refused(model_dir, case):
    _, options, extra, text = case
    with pytest.raises(ValueError, match=re.escape(text)):
        serve.build(_serve_args(model_dir, extra=extra, **options))


def test_the_same_context_twice_is_no_conflict(model_dir):
    _, plan = serve.build(_serve_args(model_dir, extra=["--context-length", "8192"], context=8192))
    assert plan.context == 8192


# ---------------------------------------------------------------------------------------------------------------
# scripts/launch_server.sh


def test_launch_server_script_dry_run(sg, model_dir):
    env = dict(
        os.environ, PATH=f"{sysconfig.get_path('scripts')}{os.pathsep}{os.environ['PATH']}", PORT=str(_free_port())
    )
    script = str(REPO / "scripts" / "launch_server.sh")
    out = subprocess.run([script, str(model_dir), "--dry-run"], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    argv = _command(out.stdout)
    args = _check_round_trip(sg, argv[4:])
    assert args.tp_size == 8 and args.ep_size == 8 and args.moe_runner_backend == "nvfp4_triton"
    assert "plan: GLM-5" not in out.stderr and "808,156 tokens" in out.stderr  # the plan, read from the folder

    # MODEL (the README lists it among the script's settings) gives way to a model path typed first; with the path
    # left out it is the model (scripts/run_loadtest.sh's test runs that way)
    more = dict(PROFILE="rtx-pro-6000x16-ep16", NODE_RANK="1", DIST_INIT_ADDR="10.0.0.1:50000", MODEL="/elsewhere")
    out = subprocess.run([script, str(model_dir), "--dry-run", "--", "--moe-runner-backend", "flashinfer_cutlass"],
                         capture_output=True, text=True, env={**env, **more}, timeout=60)  # fmt: skip
    assert out.returncode == 0, out.stderr
    args = _check_round_trip(sg, _command(out.stdout)[4:])
    assert (args.nnodes, args.node_rank, args.tp_size, args.ep_size) == (2, 1, 16, 16)
    assert args.moe_runner_backend == "flashinfer_cutlass" and args.model_path == str(model_dir)

    out = subprocess.run([script], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode != 0 and "usage:" in out.stderr


def test_model_config_from_the_folder(model_dir):
    shape, name = load_model_config(model_dir)
    assert name.endswith("config.json") and shape.experts == 256
