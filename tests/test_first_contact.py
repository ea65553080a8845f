"""What a new user meets first: the environment switches, serve's checks after --, one-line errors, the
cache never silently replaced or written under $HOME, subprocesses that import the installed package.

The wheel-install check (build, install non-editable, tune from the repository root) is in test_wheel.py.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import logging
import math
import os
import random
import re
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from sglang_glm5 import _files, env, serve
from sglang_glm5._net import check_bind
from sglang_glm5.cli import main

REPO = Path(__file__).resolve().parent.parent
HAS_SGLANG = importlib.util.find_spec("sglang.srt.server_args") is not None


def _one_line_error(out: subprocess.CompletedProcess | tuple[int, str], codes=(1, 2)) -> str:
    """The single stderr line of a failed command (a CompletedProcess, or (exit code, stderr) in-process)."""
    rc, err = (out.returncode, out.stderr) if isinstance(out, subprocess.CompletedProcess) else out
    assert rc in codes, (rc, err)
    assert "Traceback" not in err, err
    lines = [line for line in err.strip().splitlines() if "Warning" not in line and not line.startswith("  ")]
    assert len(lines) == 1, err
    return lines[0]


def _cli(*args: str, cwd: Path | None = None, env_changes: dict | None = None, timeout: float = 120):
    environ = {**os.environ, **(env_changes or {})}
    environ = {k: v for k, v in environ.items() if v is not None}
    return subprocess.run([sys.executable, "-m", "sglang_glm5.cli", *args], capture_output=True, text=True,
                          cwd=cwd, env=environ, timeout=timeout)  # fmt: skip


# ---------------------------------------------------------------------------------------------------------------
# The registry of switches.


def _rows(table: str) -> dict[str, list[str]]:
    """A markdown table's rows by their first cell, each as its cells (a cell's escaped \\| kept)."""
    rows = {}
    for line in table.strip().splitlines()[2:]:
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
        rows[cells[0]] = cells
    return rows


def test_the_switch_tables_are_the_registry():
    begin, end = "<!-- env-table:begin -->", "<!-- env-table:end -->"
    text = (REPO / "docs" / "op.md").read_text()
    assert begin in text and end in text, "docs/op.md lacks the generated table's markers"
    table = text.split(begin, 1)[1].split(end, 1)[0].strip()
    assert table == env.markdown_table(), "docs/op.md's switch table is stale: paste `python -m sglang_glm5.env`"
    readme = (REPO / "README.md").read_text().split("\n## Environment switches\n", 1)[1].split("\n## ", 1)[0]
    short = _rows(readme[readme.index("| variable |") :].split("\n\n", 1)[0])
    full = _rows(table)
    assert list(short) == list(full), f"README's switch table lists {list(short)}, the registry {list(full)}"
    for name, cells in full.items():
        assert short[name][:3] == cells[:3], f"README's row of {name}: {short[name][:3]}, the registry: {cells[:3]}"
        assert len(short[name][3]) <= 110, f"README's row of {name} is longer than one line: {short[name][3]}"
    names = {s.name for s in env.SWITCHES}
    code = [
        p
        for d in ("sglang_glm5", "patches", "loadtest", "kernels", "examples", "tests")
        for p in (REPO / d).glob("*.py")
    ]
    used = {m for p in code for m in re.findall(r"SGLANG_GLM5_[A-Z0-9_]*[A-Z0-9]", p.read_text())}
    used -= {"SGLANG_GLM5_DISABLED", "SGLANG_GLM5_MOE_PAHT"}  # the misspellings this file tests
    assert used <= names, f"switches used in the code but not in the registry: {sorted(used - names)}"


def test_bool_switches_take_one_spelling_set():
    rng = random.Random()
    for text, want in (("1", True), ("true", True), ("YES", True), (" on ", True), ("0", False), ("off", False),
                       ("", False), ("No", False)):  # fmt: skip
        assert env.get(env.DISABLE, {env.DISABLE.name: text}) is want, text
        assert env.get(env.STOCK_CONFIGS, {env.STOCK_CONFIGS.name: text}) is want, text
    bad = rng.choice(["2", "enable", "y e s", "-1"])
    with pytest.raises(env.EnvError, match=f"SGLANG_GLM5_DISABLE: expected one of .* got '{bad}'"):
        env.get(env.DISABLE, {env.DISABLE.name: bad})


def test_tokens_switches_keep_their_meaning():
    value = random.Random().uniform(0, 1e4)
    assert env.get(env.DENSE_PREFILL_MIN_TOKENS, {env.DENSE_PREFILL_MIN_TOKENS.name: repr(value)}) == value
    assert env.get(env.DENSE_PREFILL_MIN_TOKENS, {env.DENSE_PREFILL_MIN_TOKENS.name: "inf"}) == math.inf  # never
    assert env.get(env.DENSE_PREFILL_MIN_TOKENS, {}) == 384  # the default (prefill.py)
    assert env.get(env.W4A4_MIN_TOKENS, {}) is None  # then the tuner's value, else 64
    for text in ("inf", "-1", "nan", "soon"):
        with pytest.raises(env.EnvError, match="SGLANG_GLM5_W4A4_MIN_TOKENS: expected a number of tokens"):
            env.get(env.W4A4_MIN_TOKENS, {env.W4A4_MIN_TOKENS.name: text})


def test_problems_name_bad_values_and_misspelt_switches():
    errors, warnings = env.problems(
        {"SGLANG_GLM5_MOE_PATH": "w4a8", "SGLANG_GLM5_DISABLED": "1", "SGLANG_GLM5_SEED": "7", "HOME": "/x"}
    )
    assert errors == ["SGLANG_GLM5_MOE_PATH: expected one of auto, w4a16, w4a4, got 'w4a8'"]
    assert len(warnings) == 1 and "SGLANG_GLM5_DISABLED is not a sglang-glm5 switch" in warnings[0]
    assert "did you mean SGLANG_GLM5_DISABLE?" in warnings[0]


def test_the_plugin_checks_the_switches_when_it_loads(monkeypatch, caplog):
    from sglang_glm5 import patches

    applied = patches.is_applied()  # another test may have loaded the plugin in this process
    monkeypatch.setenv("SGLANG_GLM5_MOE_PATH", "w4a8")
    monkeypatch.setattr(sys, "argv", ["launch_server", "--moe-runner-backend", "nvfp4_triton"])
    with pytest.raises(SystemExit, match="SGLANG_GLM5_MOE_PATH: expected one of auto, w4a16, w4a4, got 'w4a8'"):
        patches.plugin()  # stops before it touches SGLang
    assert patches.is_applied() == applied
    monkeypatch.setenv("SGLANG_GLM5_DISABLE", "1")  # off: logged, nothing stops, nothing changes
    with caplog.at_level(logging.INFO, logger="sglang_glm5.patches"):
        patches.plugin()
    assert "SGLANG_GLM5_MOE_PATH" in caplog.text and "plugin off" in caplog.text and patches.is_applied() == applied


# ---------------------------------------------------------------------------------------------------------------
# serve: the flags after --, the switches, the host.


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("model")
    (folder / "config.json").write_text((REPO / "configs" / "models" / "glm-5.json").read_text())
    return folder


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_abbreviations_after_dashdash_are_refused_without_sglangs_list(model_dir):
    # The names serve itself knows: what argparse would expand --tp / --ep-s / --quantiz to in SGLang.
    for token, whole in (("--tp", "--tp-size"), ("--ep-s", "--ep-size"), ("--quantiz", "--quantization"),
                         ("--mem-fraction", "--mem-fraction-static")):  # fmt: skip
        with pytest.raises(ValueError, match=f"{token} \\(after --\\) is an abbreviation of {whole}"):
            serve.parse_extras([token, "4"], None)
    assert [e.name for e in serve.parse_extras(["--tp-size", "8", "--some-new-flag", "1"], None)] == [
        "tp-size", "some-new-flag",
    ]  # fmt: skip


SERVE_REFUSALS = [
    # (why, args after --, text in the one-line error)
    ("an abbreviation argparse reads as --tp-size", ["--tp", "4"], "--tp (after --) is an abbreviation of --tp-size"),
    ("an unknown flag", ["--bogus-flag", "3"], "--bogus-flag (after --) is not a flag of SGLang's launcher"),
    ("an ambiguous abbreviation", ["--quant", "fp8"], "--quant (after --) is ambiguous: --quantization"),
    ("a value SGLang's parser refuses", ["--attention-backend", "no-such-backend"], "SGLang's parser refuses"),
]  # fmt: skip


@pytest.mark.skipif(not HAS_SGLANG, reason="SGLang's modules are not installed (scripts/dev_setup.sh)")
@pytest.mark.parametrize("case", SERVE_REFUSALS, ids=[c[0] for c in SERVE_REFUSALS])
def test_serve_dry_run_refuses_what_sglang_would_misread_or_refuse(model_dir, case):
    _, extra, text = case
    out = _cli("serve", "--model", str(model_dir), "--port", str(_free_port()), "--dry-run", "--", *extra)
    line = _one_line_error(out, codes=(2,))
    assert line.startswith("sglang-glm5 serve: ") and text in line, line


@pytest.mark.parametrize(
    "variable, value, text",
    [
        ("SGLANG_GLM5_MOE_PATH", "w4a8", "SGLANG_GLM5_MOE_PATH: expected one of auto, w4a16, w4a4, got 'w4a8'"),
        ("SGLANG_GLM5_DENSE_PREFILL_MIN_TOKENS", "-5", "SGLANG_GLM5_DENSE_PREFILL_MIN_TOKENS: expected a number"),
        ("SGLANG_GLM5_STOCK_CONFIGS", "maybe", "SGLANG_GLM5_STOCK_CONFIGS: expected one of"),
    ],
)
def test_serve_dry_run_refuses_a_bad_switch_before_anything(model_dir, variable, value, text):
    out = _cli("serve", "--model", str(model_dir), "--port", str(_free_port()), "--dry-run",
               env_changes={variable: value})  # fmt: skip
    assert text in _one_line_error(out, codes=(2,))


def test_serve_names_a_host_this_machine_does_not_have(model_dir):
    host = "192.0.2.1"  # TEST-NET-1 (RFC 5737): never an address of a real machine
    with pytest.raises(ValueError, match=f"--host {host}: not an address of this machine"):
        check_bind(host, _free_port())
    with pytest.raises(ValueError, match="--host no-such-host.invalid: not an address or a name"):
        check_bind("no-such-host.invalid", _free_port())


def test_serve_warns_about_a_misspelt_switch(model_dir, monkeypatch):
    monkeypatch.setenv("SGLANG_GLM5_MOE_PAHT", "w4a16")
    launch, _ = serve.build(_serve_args(model_dir))
    assert any("SGLANG_GLM5_MOE_PAHT is not a sglang-glm5 switch" in n for n in launch.notes), launch.notes


def _serve_args(model_dir: Path):
    import argparse

    return argparse.Namespace(model=str(model_dir), profile="rtx-pro-6000x8-ep8", host="127.0.0.1",
                              port=_free_port(), api_key=None, context=None, nnodes=None, node_rank=None,
                              dist_init_addr=None, dry_run=True, extra=[])  # fmt: skip


# ---------------------------------------------------------------------------------------------------------------
# doctor


def test_doctor_fails_on_a_bad_switch_and_says_what_disable_does(tmp_path, monkeypatch, capsys):
    (tmp_path / "autotune").mkdir()
    (tmp_path / "autotune" / "rtx-pro-6000.json").write_text('{"truncated": ')
    monkeypatch.setenv("SGLANG_GLM5_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("SGLANG_GLM5_W4A4_MIN_TOKENS", "lots")
    assert main(["doctor", "--no-gpu"]) == 1
    out = capsys.readouterr().out
    assert "[FAIL] env: SGLANG_GLM5_W4A4_MIN_TOKENS: expected a number of tokens per expert >= 0, got 'lots'" in out, (
        out
    )
    assert "rtx-pro-6000.json cannot be read" in out, out
    monkeypatch.delenv("SGLANG_GLM5_W4A4_MIN_TOKENS")
    monkeypatch.setenv("SGLANG_GLM5_DISABLE", "1")
    main(["doctor", "--no-gpu"])
    out = capsys.readouterr().out
    assert "SGLANG_GLM5_DISABLE turns the plugin off" in out, out
    assert re.search(r"shipped \d+ file\(s\), [1-9]\d* entries", out), out


def test_the_readme_is_short_and_starts_with_the_first_command():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 150, f"README.md has {len(text.splitlines())} lines; at most 150"
    first = text.split("```bash\n", 1)[1].splitlines()[0]
    assert first.startswith("pip install . && sglang-glm5 quickstart"), first
    for page in ("docs/status.md", "docs/decode.md", "docs/structure.md", "docs/op.md", "docs/commands.md"):
        assert f"]({page})" in text and (REPO / page).is_file(), page


# ---------------------------------------------------------------------------------------------------------------
# One-line errors.


def _in_process(capsys, argv: list[str]) -> tuple[int, str]:
    try:
        rc = main(argv)
    except SystemExit as e:  # argparse refusals
        rc = e.code
    return rc, capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, text",
    [
        (["plan", "--context", "0"], "argument --context: expected a positive int, got '0'"),
        (["plan", "--gpu-memory-gib", "-40"], "argument --gpu-memory-gib: expected a positive float, got '-40'"),
        (["loadtest", "run", "--host", "127.0.0.1:30000", "--tag", "t"], "expected a URL with its scheme"),
    ],
)
def test_bad_arguments_are_one_line(capsys, argv, text):
    err = _in_process(capsys, argv)[1]
    line = [x for x in err.strip().splitlines() if not x.startswith("usage") and not x.startswith(" ")]
    assert len(line) == 1 and text in line[0], err


MISSING = [
    # (the command, the module it needs, the extra that brings it)
    (["stock-configs", "--out", "OUT"], "sglang", "sglang"),
    (["loadtest", "run", "--host", "http://127.0.0.1:9", "--tag", "t", "--out", "OUT"], "locust", "loadtest"),
    (["loadtest", "compare", "OUT/a", "OUT/b"], "matplotlib", "loadtest"),
]


@pytest.mark.parametrize("case", MISSING, ids=[c[1] for c in MISSING])
def test_a_missing_optional_dependency_is_one_line(capsys, monkeypatch, tmp_path, case):
    argv, module, extra = case
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == module else real(name, *a))
    line = _one_line_error(_in_process(capsys, [a.replace("OUT", str(tmp_path)) for a in argv]))
    assert f"needs {module}, which is not installed: pip install 'sglang-glm5[{extra}]'" in line
    assert not any(tmp_path.iterdir()), "nothing is written before the refusal"


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch missing")
def test_tune_local_without_a_gpu_is_one_line(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert "--target local: torch sees no CUDA GPU" in _one_line_error(
        _in_process(capsys, ["tune", "--target", "local"])
    )


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"sglang-glm5 {importlib.metadata.version('sglang-glm5')}"


def _blocked(tmp_path: Path, module: str) -> dict:
    """An environment whose PYTHONPATH holds a package ``module`` that fails to import, as a missing one does."""
    (tmp_path / module).mkdir()
    (tmp_path / module / "__init__.py").write_text(f"raise ImportError({f'No module named {module}'!r})\n")
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}


@pytest.mark.parametrize("example, module", [("openai_client.py", "openai"), ("requests_client.py", "requests")])
def test_examples_without_their_library_or_a_server(tmp_path, example, module):
    script = str(REPO / "examples" / example)
    out = subprocess.run([sys.executable, script], capture_output=True, text=True, env=_blocked(tmp_path, module),
                         timeout=60)  # fmt: skip
    assert f"pip install {module}" in _one_line_error(out, codes=(1,))
    if importlib.util.find_spec(module) is None:
        return
    url = f"http://127.0.0.1:{_free_port()}"  # nothing listens there
    out = subprocess.run([sys.executable, script, "--url", url], capture_output=True, text=True, timeout=120)
    assert f"no server answers at {url}" in _one_line_error(out, codes=(1,))


class _Recorder(BaseHTTPRequestHandler):
    """The four endpoints the requests example calls; keeps each POST body."""

    bodies: list = []

    def log_message(self, *args) -> None:
        pass

    def _send(self, status: int, body: bytes, kind: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self._send(200, json.dumps({"data": [{"id": "m"}]}).encode())

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.bodies.append((self.path, body))
        if self.path == "/generate":
            self._send(200, json.dumps({"text": "x", "meta_info": {"completion_tokens": 1}}).encode())
        elif body.get("stream"):
            chunk = {"choices": [{"delta": {"content": "x"}}], "usage": {"completion_tokens": 1}}
            self._send(200, f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n".encode(), "text/event-stream")
        else:
            self._send(200, json.dumps({"choices": [{"message": {"content": "x"}}]}).encode())


@pytest.mark.skipif(importlib.util.find_spec("requests") is None, reason="requests is not installed")
def test_requests_example_honours_max_tokens_on_every_api():
    max_tokens = random.Random().randint(2, 999)
    handler = type("Handler", (_Recorder,), {"bodies": []})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{httpd.server_address[1]}"
        script = str(REPO / "examples" / "requests_client.py")
        out = subprocess.run([sys.executable, script, "--url", url, "--max-tokens", str(max_tokens)],
                             capture_output=True, text=True, timeout=60)  # fmt: skip
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert out.returncode == 0, out.stderr
    sent = {path + (" stream" if body.get("stream") else ""): body for path, body in handler.bodies}
    assert sent["/generate"]["sampling_params"]["max_new_tokens"] == max_tokens
    assert sent["/v1/chat/completions"]["max_tokens"] == max_tokens
    assert sent["/v1/chat/completions stream"]["max_tokens"] == max_tokens
    help_text = subprocess.run([sys.executable, script, "--help"], capture_output=True, text=True, timeout=60).stdout
    assert "SGLang's native /generate." in help_text  # the whole description, not its first line


# ---------------------------------------------------------------------------------------------------------------
# The cache: a broken file is kept aside, never under $HOME in tests.


def test_a_file_that_is_not_json_is_kept_aside_then_replaced(tmp_path, caplog):
    path = tmp_path / "autotune" / "x.json"
    path.parent.mkdir()
    broken = '{"entries": {"a": ' + "".join(random.choices("0123456789", k=8))
    path.write_text(broken)
    with caplog.at_level(logging.WARNING, logger="sglang_glm5.cache"):
        data = _files.update_json(path, lambda d: d.update(b=2))
    assert data == {"b": 2} and json.loads(path.read_text()) == {"b": 2}
    kept = list(path.parent.glob("x.json.corrupt-*"))
    assert len(kept) == 1 and kept[0].read_text() == broken
    assert f"kept it as {kept[0].name}" in caplog.text and "not valid JSON" in caplog.text
    path.write_text("[1, 2]")  # valid JSON, but not an object: kept aside as well, under another name
    _files.update_json(path, lambda d: d.update(c=3))
    assert len(list(path.parent.glob("x.json.corrupt-*"))) == 2


def test_the_suite_runs_with_a_temporary_cache():
    cache = env.cache_dir().resolve()
    assert not cache.is_relative_to(Path.home().resolve() / ".cache"), cache
    assert cache.name.startswith("sglang_glm5_test_cache_")


def test_writes_through_the_default_cache_path():
    """Run by the next test in a pytest subprocess: writes where the library writes by default."""
    _files.update_json(_files.cache_dir() / "probe.json", lambda d: d.update(probe=1))


def test_a_test_run_leaves_home_untouched(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    environ = {k: v for k, v in os.environ.items() if k != env.CACHE_DIR.name}
    environ.update(HOME=str(home), PYTHONDONTWRITEBYTECODE="1")
    test = f"{Path(__file__).name}::test_writes_through_the_default_cache_path"
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test], cwd=REPO / "tests",
                         capture_output=True, text=True, env=environ, timeout=300)  # fmt: skip
    assert out.returncode == 0 and "1 passed" in out.stdout, out.stdout + out.stderr
    assert list(home.rglob("*")) == [], list(home.rglob("*"))


# ---------------------------------------------------------------------------------------------------------------
# Subprocesses import the installed package, whatever the current directory holds.


def test_compile_workers_ignore_a_sglang_glm5_folder_in_the_current_directory(tmp_path, monkeypatch):
    from sglang_glm5.hardware import TARGETS
    from sglang_glm5.variants import w4a16_tiles

    decoy = tmp_path / "sglang_glm5"
    decoy.mkdir()
    (decoy / "__init__.py").write_text("raise ImportError('the decoy in the current directory was imported')\n")
    for worker in ("aot.py", "tiles.py"):  # the compile worker (python -m sglang_glm5.aot) and its jobs' module
        (decoy / worker).write_text("raise SystemExit(3)\n")
    monkeypatch.chdir(tmp_path)
    cfg = w4a16_tiles.heuristic_config(1).gemm1
    shared = w4a16_tiles.compiled_shared_bytes("gemm1", cfg, TARGETS["rtx-pro-6000"], memo=False)
    assert 0 < shared <= TARGETS["rtx-pro-6000"].shared_per_block


# ---------------------------------------------------------------------------------------------------------------
# Smaller defaults.


def test_compare_reuses_the_slos_run_stored(tmp_path, capsys):
    from test_loadtest import _write_folder  # a results folder with known timings (tests/test_loadtest.py)

    ttft, tpot = random.Random().choice([(150.0, 90.0), (250.0, 40.0), (500.0, 100.0)])
    folders = [_write_folder(tmp_path / name, speed) for name, speed in (("baseline", 1.0), ("patched", 1.3))]
    for folder in folders:
        meta = json.loads((folder / "run.json").read_text())
        (folder / "run.json").write_text(json.dumps({**meta, "slo": {"ttft_ms": ttft, "tpot_ms": tpot}}))
    out = tmp_path / "cmp"
    assert main(["loadtest", "compare", *map(str, folders), "--out", str(out)]) == 0
    assert json.loads((out / "report.json").read_text())["slo"] == {"ttft_ms": ttft, "tpot_ms": tpot}
    assert main(["loadtest", "compare", *map(str, folders), "--out", str(out), "--slo-ttft-ms", "77"]) == 0
    assert json.loads((out / "report.json").read_text())["slo"] == {"ttft_ms": 77.0, "tpot_ms": tpot}
    capsys.readouterr()
    meta = json.loads((folders[1] / "run.json").read_text())
    (folders[1] / "run.json").write_text(json.dumps({**meta, "slo": {"ttft_ms": ttft + 1, "tpot_ms": tpot}}))
    line = _one_line_error(_in_process(capsys, ["loadtest", "compare", *map(str, folders), "--out", str(out)]))
    assert "different ttft_ms SLOs" in line and "pass --slo-ttft-ms" in line


def test_stock_configs_writes_to_the_user_cache_by_default(monkeypatch, capsys):
    from sglang_glm5 import stock_configs

    written = []
    monkeypatch.setattr(stock_configs, "generate", lambda out: written.append(out) or [])
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object())  # SGLang "installed"
    assert main(["stock-configs"]) == 0
    assert written == [env.cache_dir() / "sglang_moe"]
    assert f"SGLANG_MOE_CONFIG_DIR={written[0]}" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------------------------------
# selfcheck without a GPU


def test_selfcheck_on_the_cpu_runs_the_interpreter_by_itself(tmp_path):
    """The command sets TRITON_INTERPRET before any kernel is defined (a shell without it, as a user has). The shape
    has fewer experts than GLM-5's top-8: such an 'E,H,I' routes each token to all E (it once failed in the sort)."""
    out = _cli("selfcheck", "--device", "cpu", "--tokens", "1,5", "--shape", "4,64,32", "--seed", "3",
               env_changes={"TRITON_INTERPRET": None, "SGLANG_GLM5_CACHE_DIR": str(tmp_path)}, timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert "CPU, Triton interpreter" in out.stdout and out.stdout.count(" ok") == 2, out.stdout
    assert "selfcheck: passed" in out.stdout


# ---------------------------------------------------------------------------------------------------------------
# Output piped into a reader that stops early; a misspelt option; --profile.


def test_every_command_piped_into_a_reader_that_stops_early_ends_quietly(capsys):
    """`sglang-glm5 COMMAND | head -1`, made certain: stdout is a pipe whose reader is gone before the command writes
    (as when head has read its line and exited), so every write fails. One shell runs every command of `--help`."""
    with pytest.raises(SystemExit):
        main(["--help"])
    commands = re.search(r"\{([a-z,-]+)\}", capsys.readouterr().out).group(1).split(",")
    assert "quickstart" in commands and "doctor" in commands, commands
    runs = [["--help"], *([c, "--help"] for c in commands), ["loadtest", "compare", "--help"], ["plan"]]
    script = "".join(f"echo '== {' '.join(r)}' >&2; {sys.executable} -m sglang_glm5.cli {' '.join(r)}; echo rc=$? >&2\n"
                     for r in runs)  # fmt: skip
    read, write = os.pipe()
    os.close(read)
    try:
        out = subprocess.run(["bash", "-c", script], stdout=write, stderr=subprocess.PIPE, text=True, timeout=300)
    finally:
        os.close(write)
    blocks = out.stderr.split("== ")[1:]
    assert len(blocks) == len(runs), out.stderr
    for block in blocks:
        assert "Traceback" not in block and "BrokenPipeError" not in block and "Exception ignored" not in block, block
        assert re.search(r"rc=(0|141)\n", block), block


@pytest.mark.parametrize(
    "argv, usage, hint",
    [
        (["plan", "--proflie", "h200x8"], "usage: sglang-glm5 plan ", "--proflie (did you mean --profile?)"),
        (["loadtest", "compare", "a", "b", "--sol-ttft-ms", "5"], "usage: sglang-glm5 loadtest compare ",
         "--sol-ttft-ms (did you mean --slo-ttft-ms?)"),
        (["doctor", "--no-gpus"], "usage: sglang-glm5 doctor ", "--no-gpus (did you mean --no-gpu?)"),
    ],
)  # fmt: skip
def test_a_misspelt_option_prints_its_commands_usage(capsys, argv, usage, hint):
    rc, err = _in_process(capsys, argv)
    assert rc == 2 and err.startswith(usage) and f"unrecognized arguments: {hint}" in err, err


def test_profile_lists_the_shipped_names_and_takes_a_toml_file(capsys, tmp_path):
    from sglang_glm5.profiles import DEFAULT_PROFILE, profile_names

    for command in (["plan"], ["serve", "--model", "m"]):
        with pytest.raises(SystemExit):
            main([*command, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        assert all(name in text.replace("- ", "-") for name in profile_names()), text
        assert "path to a TOML file" in text
    shipped = (REPO / "configs" / "profiles" / f"{DEFAULT_PROFILE}.toml").read_text()
    mine = tmp_path / "mine.toml"
    mine.write_text(shipped)
    assert main(["plan", "--profile", DEFAULT_PROFILE]) == 0
    by_name = capsys.readouterr().out
    assert main(["plan", "--profile", str(mine)]) == 0
    assert capsys.readouterr().out == by_name.replace(f"under {DEFAULT_PROFILE}:", f"under {mine}:")
    gpu = random.choice(["rtx-9000", "h300", "RTX PRO 6000"])
    mine.write_text(re.sub(r'(?m)^gpu = ".*"$', f'gpu = "{gpu}"', shipped))
    line = _one_line_error(_in_process(capsys, ["plan", "--profile", str(mine)]))
    assert f"profile {mine}: gpu must be one of rtx-pro-6000" in line and repr(gpu) in line, line
    line = _one_line_error(_in_process(capsys, ["plan", "--profile", str(tmp_path / "none.toml")]))
    assert "none.toml: cannot read it" in line, line


# ---------------------------------------------------------------------------------------------------------------
# loadtest accuracy: the baseline's tag is its throughput run's; compare names the command that fills a gap.


def _run_json(folder: Path, host: str) -> Path:
    folder.mkdir(parents=True)
    (folder / "run.json").write_text(json.dumps({"tag": folder.name, "host": host}))
    return folder


def test_accuracy_files_the_baseline_under_its_throughput_runs_tag(tmp_path, monkeypatch, capsys):
    from sglang_glm5.cli import build_parser
    from sglang_glm5.loadtest import accuracy

    ports = random.Random().sample(range(20000, 30000), 3)
    base, ours, other = (f"http://127.0.0.1:{p}" for p in ports)
    tag = random.choice(["base", "stock", "fi-cutlass"])
    _run_json(tmp_path / tag, base)
    _run_json(tmp_path / "ours", ours)
    measured = []
    monkeypatch.setattr(accuracy, "measure", lambda args, side, ref: measured.append((side.tag, ref)) or 0)
    argv = ["loadtest", "accuracy", "--host", ours, "--tag", "ours", "--out", str(tmp_path), "--baseline-host"]
    args = build_parser().parse_args([*argv, base + "/"])
    assert args.func(args) == 0
    assert measured == [(tag, None), ("ours", str(tmp_path / tag))], measured
    assert f"--baseline-tag {tag} (the throughput run in {tmp_path / tag} loaded {base})" in capsys.readouterr().out
    assert accuracy.baseline_tag(tmp_path, other, "ours") == accuracy.DEFAULT_BASELINE_TAG  # no run loaded it
    _run_json(tmp_path / "again", base)
    with pytest.raises(ValueError, match=f"the throughput runs again, {tag} under .* all loaded it"):
        accuracy.baseline_tag(tmp_path, base, "ours")


def test_compare_names_the_command_that_fills_a_missing_accuracy_result(tmp_path, capsys):
    from test_loadtest import _write_folder  # a results folder with known timings (tests/test_loadtest.py)

    ports = random.Random().sample(range(20000, 30000), 2)
    hosts = [f"http://127.0.0.1:{p}" for p in ports]
    folders = [_write_folder(tmp_path / name, speed) for name, speed in (("stock", 1.0), ("ours", 1.2))]
    for folder, host in zip(folders, hosts, strict=True):
        meta = json.loads((folder / "run.json").read_text())
        (folder / "run.json").write_text(json.dumps({**meta, "host": host}))
    assert main(["loadtest", "compare", *map(str, folders), "--out", str(tmp_path / "cmp")]) == 0
    out = capsys.readouterr().out
    want = (f"sglang-glm5 loadtest accuracy --host {hosts[1]} --tag ours --out {tmp_path} --baseline-host {hosts[0]} "
            f"--baseline-tag stock")  # fmt: skip
    assert want in out, out
    (tmp_path / "stock" / "run.json").write_text(json.dumps({**meta, "tag": "stock", "host": hosts[1]}))  # one port
    assert main(["loadtest", "compare", *map(str, folders), "--out", str(tmp_path / "cmp")]) == 0
    out = capsys.readouterr().out
    assert f"with the baseline server up: sglang-glm5 loadtest accuracy --host {hosts[1]} --tag stock" in out, out
    assert f"--tag ours --out {tmp_path} --reference {folders[0]}" in out, out


# ---------------------------------------------------------------------------------------------------------------
# The examples against a server that accepts the connection and never answers.


@pytest.mark.parametrize("example, module", [("openai_client.py", "openai"), ("requests_client.py", "requests")])
def test_examples_give_up_on_a_server_that_never_answers(example, module):
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed")
    with socket.socket() as listener:  # the kernel completes the handshake; nothing ever reads or answers
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        timeout = random.Random().choice([0.5, 1.0, 1.5])
        t0 = time.monotonic()
        out = subprocess.run([sys.executable, str(REPO / "examples" / example), "--url", url, "--timeout",
                              str(timeout)], capture_output=True, text=True, timeout=60)  # fmt: skip
        elapsed = time.monotonic() - t0
    line = _one_line_error(out, codes=(1,))
    assert f"the server at {url} accepted the connection but did not answer in time (--timeout {timeout:g} s" in line
    assert elapsed < 30, elapsed
