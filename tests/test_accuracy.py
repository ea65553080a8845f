"""`loadtest accuracy` and the accuracy part of `loadtest compare`, against fake SGLang servers on 127.0.0.1.

The fakes (loadtest_server.py) serve a toy model whose full next-token distributions the tests can
compute themselves; a "patched" fake adds seeded noise of a known scale to its logits. Every run here
is in this process and takes well under a second.
"""

from __future__ import annotations

import json
import math
import os
import random
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from loadtest_server import VOCAB, FakeSGLang, next_token_logprobs, tokenize

from sglang_glm5.cli import main
from sglang_glm5.loadtest import accuracy, corpus
from sglang_glm5.loadtest import accuracy_stats as st
from sglang_glm5.loadtest.workload import Workload


@pytest.fixture
def seed(request) -> int:
    value = int(os.environ.get("SGLANG_GLM5_SEED", "0")) or int.from_bytes(os.urandom(4), "little")
    print(f"{request.node.name}: seed {value}")
    return value


def _accuracy(out: Path, host: str, tag: str, *extra: str) -> int:
    return main(["loadtest", "accuracy", "--host", host, "--tag", tag, "--out", str(out), "--retries", "1", *extra])


def _summary(out: Path, tag: str) -> dict:
    return json.loads((out / tag / "accuracy" / "accuracy.json").read_text())


def _expected_kl(passages: list[str], model_seed: int, perturb: float, noise_seed: int, k: int) -> tuple:
    """Per-position KL over the tokens both top-k lists hold plus one tail bucket, from the full distributions."""
    kls, agree = [], []
    for text in passages:
        ids = tokenize(text)
        for pos in range(1, len(ids)):
            p = next_token_logprobs(ids[pos - 1], pos, model_seed)
            q = next_token_logprobs(ids[pos - 1], pos, model_seed, perturb, noise_seed)
            top_p, top_q = np.argsort(-p, kind="stable")[:k], np.argsort(-q, kind="stable")[:k]
            common = np.intersect1d(top_p, top_q)
            pc, qc = np.exp(p[common]), np.exp(q[common])
            p_tail, q_tail = max(1 - pc.sum(), 0.0), max(1 - qc.sum(), 1e-10)
            value = float(np.sum(pc * (p[common] - q[common])))
            if p_tail > 0:
                value += p_tail * math.log(p_tail / q_tail)
            kls.append(max(value, 0.0))
            agree.append(top_p[0] == top_q[0])
    return np.array(kls), float(np.mean(agree))


@pytest.mark.parametrize(
    "k, n_passages",
    [(20, 10), (VOCAB, 3)],  # 20: the tail bucket matters; VOCAB: the lists are the full distribution
)
def test_kl_matches_the_perturbation(tmp_path, seed, k, n_passages):
    rng = random.Random(seed)
    model_seed, noise_seed, corpus_seed = rng.randrange(2**31), rng.randrange(2**31), rng.randrange(1000)
    perturb = rng.uniform(0.2, 1.0)
    with (
        FakeSGLang(model_seed=model_seed) as base,
        FakeSGLang(model_seed=model_seed, perturb=perturb, noise_seed=noise_seed) as patched,
    ):
        rc = _accuracy(tmp_path, patched.url, "patched", "--baseline-host", base.url, "--no-tasks",
                       "--passages", str(n_passages), "--seed", str(corpus_seed), "--top-logprobs", str(k))  # fmt: skip
    assert rc == 0
    got = _summary(tmp_path, "patched")["kl"]["vs_reference"]
    passages = corpus.generated_passages(n_passages, corpus_seed)
    kls, agree = _expected_kl(passages, model_seed, perturb, noise_seed, k)
    print(f"perturb {perturb:.3f}, k {k}: reported {got['mean']:.5f}, independent {kls.mean():.5f}")
    assert got["positions"] == len(kls) == sum(len(tokenize(t)) - 1 for t in passages)
    assert got["mean"] == pytest.approx(kls.mean(), rel=0.01)
    assert got["p99"] == pytest.approx(np.percentile(kls, 99), rel=0.01)
    assert got["top1_agreement"] == pytest.approx(agree, abs=1e-12)
    assert 0 < got["mean"] and got["top1_agreement"] < 1
    if k == VOCAB:  # full support: the plain KL divergence, no bucket anywhere
        full = []
        for text in passages:
            ids = tokenize(text)
            for pos in range(1, len(ids)):
                p = next_token_logprobs(ids[pos - 1], pos, model_seed)
                q = next_token_logprobs(ids[pos - 1], pos, model_seed, perturb, noise_seed)
                full.append(float(np.sum(np.exp(p) * (p - q))))
        assert got["mean"] == pytest.approx(np.mean(full), rel=0.01)


def test_identical_servers_and_a_saved_reference_give_zero(tmp_path, seed):
    model_seed = random.Random(seed).randrange(2**31)
    with FakeSGLang(model_seed=model_seed) as a:
        assert _accuracy(tmp_path, a.url, "ref", "--no-tasks", "--passages", "8") == 0
    with FakeSGLang(model_seed=model_seed) as b:  # another server, same model: against the saved file
        ref = tmp_path / "ref" / "accuracy" / "logprobs.jsonl.gz"
        assert _accuracy(tmp_path, b.url, "again", "--no-tasks", "--passages", "8", "--reference", str(ref)) == 0
    got = _summary(tmp_path, "again")["kl"]
    assert got["reference"]["tag"] == "ref"
    v = got["vs_reference"]
    assert (v["mean"], v["p99"], v["max"], v["top1_agreement"]) == (0.0, 0.0, 0.0, 1.0)
    assert v["positions"] > 100 and v["passages"] == 8


def _answers(problems):
    return {p.question: p.answer for p in problems}


def _wrong(problems, n, rng):
    return frozenset(p.question for p in rng.sample(problems, n))


def _loadtest_folder(path: Path) -> None:
    """A minimal `loadtest run` folder (1 level, 1 repeat) so that `compare` has a throughput to report."""
    workload = Workload(input_len=8, output_len=4).to_dict()
    meta = {"tag": path.name, "model": "m", "model_path": "m", "workload": workload,
            "concurrency": [1], "duration_s": 1.0, "repeats": 1}  # fmt: skip
    row = {"concurrency": 1, "repeat": 0, "ok": True, "ttft": 0.02, "itl": [0.02] * 3, "tpot": 0.02, "e2e": 0.08,
           "output_tokens": 4, "output_chunks": 4, "input_tokens": 8, "expected_output_tokens": 4, "status": 200,
           "error": None}  # fmt: skip
    rows = [{**row, "start_unix": 100.0 + 0.1 * i} for i in range(12)]
    path.mkdir(parents=True, exist_ok=True)
    (path / "run.json").write_text(json.dumps(meta))
    (path / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_accuracy_interval_and_compare_flags_a_drop(tmp_path, seed):
    rng = random.Random(seed)
    n, pseed = 200, rng.randrange(1000)
    problems = corpus.generated_problems(n, pseed)
    answers = _answers(problems)
    # 90 % and 80 % right; a question the generator repeats is answered wrong each time it comes.
    base_wrong, wrong = _wrong(problems, n // 10, rng), _wrong(problems, n // 5, rng)
    with (
        FakeSGLang(answers=answers, wrong=base_wrong) as base,
        FakeSGLang(answers=answers, wrong=wrong) as patched,
    ):
        rc = _accuracy(tmp_path, patched.url, "patched", "--baseline-host", base.url, "--no-kl",
                       "--problems", str(n), "--seed", str(pseed))  # fmt: skip
    assert rc == 0
    t = _summary(tmp_path, "patched")["tasks"]
    right = sum(p.question not in wrong for p in problems)
    base_right = sum(p.question not in base_wrong for p in problems)
    acc, base_acc = right / n, base_right / n
    assert 0.78 <= acc <= 0.8 and 0.88 <= base_acc <= 0.9
    assert (t["answered"], t["correct"], t["failed"]) == (n, right, 0)
    lo, hi = t["interval_95"]
    assert lo < 0.8 < hi and hi - lo < 0.15
    assert _summary(tmp_path, "baseline")["tasks"]["accuracy"] == pytest.approx(base_acc)
    diff = acc - base_acc
    assert t["vs_reference"]["diff"] == pytest.approx(diff) and t["vs_reference"]["verdict"] == "dropped"

    for tag in ("baseline", "patched"):
        _loadtest_folder(tmp_path / tag)
    out = tmp_path / "cmp"
    assert main(["loadtest", "compare", str(tmp_path / "baseline"), str(tmp_path / "patched"), "--out", str(out)]) == 0
    rep = json.loads((out / "report.json").read_text())["accuracy"]["tasks"]
    assert rep["diff"] == pytest.approx(diff) and rep["high"] < 0 and rep["verdict"] == "dropped"
    text = (out / "report.md").read_text()
    assert "ACCURACY DROPPED beyond the 95% interval" in text and "at the same accuracy" not in text
    assert f"{base_acc:.3f} -> {acc:.3f}" in text


def test_compare_without_accuracy_says_so(tmp_path):
    for tag in ("baseline", "patched"):
        _loadtest_folder(tmp_path / tag)
    (tmp_path / "patched" / "accuracy").mkdir()
    (tmp_path / "patched" / "accuracy" / "accuracy.json").write_text("{truncated")  # a damaged record
    out = tmp_path / "cmp"
    assert main(["loadtest", "compare", str(tmp_path / "baseline"), str(tmp_path / "patched"), "--out", str(out)]) == 0
    text = (out / "report.md").read_text()
    assert "**1.00x the throughput**; accuracy not compared" in text
    assert "accuracy not compared: " in text and "accuracy.json: cannot read it (JSONDecodeError" in text
    assert "at the same accuracy" not in text


def test_compare_reports_same_accuracy_and_kl(tmp_path, seed):
    rng = random.Random(seed)
    problems = corpus.generated_problems(100, 0)
    answers = _answers(problems)
    model_seed = rng.randrange(2**31)
    with (  # both 80 % right, on different problems: the same accuracy, paired difference 0
        FakeSGLang(model_seed=model_seed, answers=answers, wrong=_wrong(problems, 20, rng)) as base,
        FakeSGLang(model_seed=model_seed, perturb=0.3, answers=answers, wrong=_wrong(problems, 20, rng)) as patched,
    ):
        assert _accuracy(tmp_path, base.url, "baseline", "--passages", "5", "--problems", "100") == 0
        assert _accuracy(tmp_path, patched.url, "patched", "--passages", "5", "--problems", "100") == 0
    for tag in ("baseline", "patched"):
        _loadtest_folder(tmp_path / tag)
    out = tmp_path / "cmp"
    assert main(["loadtest", "compare", str(tmp_path / "baseline"), str(tmp_path / "patched"), "--out", str(out)]) == 0
    acc = json.loads((out / "report.json").read_text())["accuracy"]
    assert acc["tasks"]["diff"] == 0 and acc["tasks"]["verdict"] == "same"
    assert acc["kl"]["mean"] > 0 and acc["kl"]["positions"] > 100  # computed by compare from both logprob files
    text = (out / "report.md").read_text()
    assert "at the same accuracy" in text and "DROPPED" not in text
    assert f"KL {acc['kl']['mean']:.4g} mean" in text


SHIM = """#!/usr/bin/env bash
# `sglang-glm5 serve ... --port P -- --moe-runner-backend B` starts a fake server; anything else is the real CLI.
if [[ "$1" == serve ]]; then
    args=("$@")
    for ((i = 0; i < ${#args[@]}; i++)); do [[ "${args[i]}" == --port ]] && port=${args[i + 1]}; done
    extra=()
    [[ " $* " == *" nvfp4_triton "* ]] && extra=(--perturb 0.3 --wrong-every 5)  # the "patched" server
    exec PYTHON TESTS/loadtest_server.py --port "$port" --problems 40 --lifetime 90 "${extra[@]}"
fi
exec PYTHON -m sglang_glm5.cli "$@"
"""


def test_run_loadtest_script_reports_accuracy_beside_the_gain(tmp_path):
    """scripts/run_loadtest.sh end to end, its two servers being fakes: the report flags the accuracy drop."""
    tests = Path(__file__).parent
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "sglang-glm5"
    shim.write_text(SHIM.replace("PYTHON", sys.executable).replace("TESTS", str(tests)))
    shim.chmod(0o755)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "results"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PORT": str(port), "OUT": str(out),
           "CONCURRENCY": "1", "DURATION": "2", "REPEATS": "1", "WARMUP": "0",
           "ACCURACY_ARGS": "--passages 4 --problems 40 --concurrency 4", "MODEL": "/models/fake"}  # fmt: skip
    # MODEL from the environment: every argument is `loadtest run`'s (the first was once dropped as the model's)
    proc = subprocess.run(["bash", str(tests.parent / "scripts" / "run_loadtest.sh"), "--input-len", "24"], env=env,
                          capture_output=True, text=True, timeout=150)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for side in ("baseline", "patched"):
        assert json.loads((out / side / "run.json").read_text())["workload"]["input_len"] == 24
    assert "accuracy patched: tasks vs reference: -20.0 points" in proc.stdout
    text = (out / "compare_baseline_vs_patched" / "report.md").read_text()
    assert "ACCURACY DROPPED beyond the 95% interval" in text and "1.000 -> 0.800" in text
    acc = json.loads((out / "compare_baseline_vs_patched" / "report.json").read_text())["accuracy"]
    assert acc["kl"]["mean"] > 0 and acc["kl"]["passages"] == 4


# --- bad input: one line, exit 2, nothing written --------------------------------------------------


def _one_line_error(capsys, rc: int, expected: str) -> None:
    err = capsys.readouterr().err
    assert rc == 2, err
    assert len(err.strip().splitlines()) == 1 and expected in err, err
    assert "Traceback" not in err


def _nothing_written(out: Path, tag: str) -> None:
    folder = out / tag
    assert not (folder / "accuracy").exists()
    assert not folder.exists() or not any(p.name.startswith(".accuracy") for p in folder.iterdir())


def test_server_without_prompt_logprobs(tmp_path, capsys):
    with FakeSGLang(logprobs=False) as server:
        rc = _accuracy(tmp_path, server.url, "x", "--passages", "3", "--no-tasks")
    _one_line_error(capsys, rc, "cannot score prompts: /generate with return_logprob")
    _nothing_written(tmp_path, "x")


@pytest.mark.parametrize(
    "content, expected",
    [
        (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "expected UTF-8 text, found a NUL byte at offset 8"),  # an image
        (b"caf\xe9 au lait\n\nsecond passage", "expected UTF-8 text, found byte 0xe9 at offset 3"),  # Latin-1
        (b'{"text": "ok"}\n{"txt": "no"}\n', "corpus.bin:2: expected a JSON object with a non-empty 'text'"),
    ],
)
def test_corpus_that_is_not_text(tmp_path, capsys, content, expected):
    path = tmp_path / "corpus.bin"
    path.write_bytes(content)
    with FakeSGLang() as server:
        rc = _accuracy(tmp_path, server.url, "x", "--corpus", str(path), "--no-tasks")
        assert server.requests == 0
    _one_line_error(capsys, rc, expected)
    _nothing_written(tmp_path, "x")


@pytest.mark.parametrize(
    "host, options, expected",
    [
        # a zero timeout once failed every request as "connection error ... (expected an SGLang server)"
        ("URL", ["--request-timeout", "0"], "--request-timeout 0: expected a positive number of seconds"),
        ("URL", ["--retry-backoff", "-1"], "--retry-backoff -1: expected a number of seconds >= 0"),
        ("127.0.0.1:30000", [], "--host 127.0.0.1:30000: expected a URL with its scheme, e.g. http://127.0.0.1:30000"),
        ("URL", ["--baseline-host", "localhost:1"], "--baseline-host localhost:1: expected a URL with its scheme"),
    ],
)
def test_bad_options_are_named_before_any_request(tmp_path, capsys, host, options, expected):
    with FakeSGLang() as server:
        rc = _accuracy(tmp_path, server.url if host == "URL" else host, "x", "--passages", "3", *options)
        assert server.requests == 0
    _one_line_error(capsys, rc, expected)
    _nothing_written(tmp_path, "x")


@pytest.mark.parametrize(
    "lines, expected",
    [
        (['{"question": "1+1?", "answer": "#### 2"}', '{"question": "2+2?"}'], "data.jsonl:2: no 'answer' field"),
        (['{"question": "1+1?", "answer": "two"}'], "data.jsonl:1: answer 'two' is not a number"),
        (["not json"], "data.jsonl:1: expected a JSON object"),
    ],
)
def test_dataset_errors(tmp_path, capsys, lines, expected):
    path = tmp_path / "data.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with FakeSGLang() as server:
        rc = _accuracy(tmp_path, server.url, "x", "--dataset", str(path), "--no-kl")
    _one_line_error(capsys, rc, expected)
    _nothing_written(tmp_path, "x")


def test_dataset_gsm8k_style(tmp_path):
    path = tmp_path / "gsm.jsonl"
    rows = [{"question": f"What is {a} times {b}?", "answer": f"{a} * {b} = {a * b}\n#### {a * b:,}"}
            for a, b in ((12, 11), (130, 9), (7, 7))]  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    problems = corpus.read_dataset(path)
    assert [p.answer for p in problems] == [132.0, 1170.0, 49.0]
    with FakeSGLang(answers=_answers(problems), wrong=frozenset([problems[1].question])) as server:
        assert _accuracy(tmp_path, server.url, "g", "--dataset", str(path), "--no-kl") == 0
    t = _summary(tmp_path, "g")["tasks"]
    assert (t["correct"], t["answered"]) == (2, 3)
    rows = [json.loads(x) for x in (tmp_path / "g" / "accuracy" / "answers.jsonl").read_text().splitlines()]
    assert [r["correct"] for r in rows] == [True, False, True] and rows[1]["answer"] == 1171.0


def test_servers_with_different_tokenizers_stop_the_run(tmp_path, capsys):
    with FakeSGLang() as base, FakeSGLang(tokenizer_salt=1) as patched:
        rc = _accuracy(tmp_path, patched.url, "patched", "--baseline-host", base.url, "--no-tasks", "--passages", "4")
    _one_line_error(capsys, rc, "token ids differ in passage 0 at position 0")
    assert (tmp_path / "baseline" / "accuracy" / "accuracy.json").exists()  # the baseline's own run stands
    _nothing_written(tmp_path, "patched")


def test_server_dying_mid_run_is_counted_not_passed_off(tmp_path, capsys):
    problems = corpus.generated_problems(60, 0)
    with FakeSGLang(answers=_answers(problems), die_after=25) as server:
        rc = _accuracy(tmp_path, server.url, "d", "--passages", "10", "--problems", "60", "--concurrency", "4",
                       "--retry-backoff", "0.001")
    captured = capsys.readouterr()
    assert rc == 1 and "Traceback" not in captured.out + captured.err
    assert "INCOMPLETE" in captured.out
    s = _summary(tmp_path, "d")
    assert s["complete"] is False
    assert s["kl"]["passages_ok"] == 10 and s["tasks"]["answered"] == 25 - 10
    assert s["tasks"]["failed"] == 60 - 15 == s["failed_requests"]
    assert sum(s["tasks"]["failure_kinds"].values()) == 45
    assert any(k.startswith("server down") for k in s["tasks"]["failure_kinds"])
    _loadtest_folder(tmp_path / "d")
    _loadtest_folder(tmp_path / "base")
    (tmp_path / "base" / "accuracy").mkdir()
    (tmp_path / "base" / "accuracy" / "accuracy.json").write_text(json.dumps({**s, "complete": True}))
    (tmp_path / "base" / "accuracy" / "answers.jsonl").write_text(
        (tmp_path / "d" / "accuracy" / "answers.jsonl").read_text()
    )
    out = tmp_path / "cmp"
    assert main(["loadtest", "compare", str(tmp_path / "base"), str(tmp_path / "d"), "--out", str(out)]) == 0
    assert "patched accuracy run is INCOMPLETE (45 failed requests)" in (out / "report.md").read_text()


def test_retries_absorb_transient_errors(tmp_path):
    problems = corpus.generated_problems(20, 0)
    with FakeSGLang(behaviours=("ok", "500"), answers=_answers(problems)) as server:
        assert _accuracy(tmp_path, server.url, "r", "--no-kl", "--problems", "20", "--concurrency", "1",
                         "--retry-backoff", "0.001") == 0
        assert server.requests == 39  # HTTP 500 on every other request: problems 2-20 needed one retry each
    assert _summary(tmp_path, "r")["tasks"]["correct"] == 20


def test_existing_results_are_kept_without_overwrite(tmp_path, capsys):
    with FakeSGLang() as server:
        assert _accuracy(tmp_path, server.url, "k", "--no-tasks", "--passages", "2") == 0
        before = (tmp_path / "k" / "accuracy" / "accuracy.json").read_text()
        capsys.readouterr()
        rc = _accuracy(tmp_path, server.url, "k", "--no-tasks", "--passages", "2")
    _one_line_error(capsys, rc, "accuracy exists; pick another --tag or pass --overwrite")
    assert (tmp_path / "k" / "accuracy" / "accuracy.json").read_text() == before


# --- the figures on their own ----------------------------------------------------------------------


def test_position_kl_against_full_distributions(seed):
    rng = np.random.default_rng(seed)
    for _ in range(50):
        v = int(rng.integers(5, 60))
        p = rng.normal(size=v) * rng.uniform(0.5, 4)
        q = p + rng.normal(size=v) * rng.uniform(0, 1)
        p, q = p - np.log(np.exp(p).sum()), q - np.log(np.exp(q).sum())
        full = float(np.sum(np.exp(p) * (p - q)))
        as_list = lambda x, k: [(int(t), float(x[t])) for t in np.argsort(-x)[:k]]  # noqa: E731
        assert st.position_kl(as_list(p, v), as_list(q, v)) == pytest.approx(full, rel=1e-9, abs=1e-12)
        k = int(rng.integers(1, v))
        assert st.position_kl(as_list(p, k), as_list(q, k)) <= full + 1e-12  # coarsening never adds divergence
        assert st.position_kl(as_list(p, k), as_list(p, k)) == 0.0


@pytest.mark.parametrize(
    "k, n, low, high",
    [  # Wilson intervals published by Newcombe (1998), Statistics in Medicine 17:857, table I
        (81, 263, 0.2553, 0.3662),
        (15, 148, 0.0624, 0.1605),
        (0, 20, 0.0, 0.1611),
        (1, 29, 0.0061, 0.1718),
    ],
)
def test_wilson_published_values(k, n, low, high):
    lo, hi = st.wilson(k, n)
    assert (round(lo, 4), round(hi, 4)) == (low, high)


def test_paired_difference(seed):
    # No correlation (phi = 0): the paired interval is the unpaired hybrid score interval.
    d = st.paired_difference(both=20, base_only=20, patched_only=30, neither=30)
    lb, ub = st.wilson(40, 100)
    lp, up = st.wilson(50, 100)
    assert d["diff"] == pytest.approx(0.1)
    assert d["low"] == pytest.approx(0.1 - math.hypot(0.5 - lp, ub - 0.4))
    assert d["high"] == pytest.approx(0.1 + math.hypot(up - 0.5, 0.4 - lb))
    # Coverage: two correlated servers, true accuracies 0.75 and 0.70, 300 problems.
    rng = np.random.default_rng(seed)
    covered = 0
    for _ in range(400):
        u = rng.random(300)  # shared: a problem hard for one server tends to be hard for the other
        base = u < 0.75
        patched = np.where(rng.random(300) < 0.1, rng.random(300) < 0.70, u < 0.70)  # 10 %: drawn on its own
        r = st.paired_difference(int(np.sum(base & patched)), int(np.sum(base & ~patched)),
                                 int(np.sum(~base & patched)), int(np.sum(~base & ~patched)))  # fmt: skip
        covered += r["low"] <= -0.05 <= r["high"]
    assert covered / 400 > 0.90


@pytest.mark.parametrize(
    "text, expected",
    [
        ("so the total is 5 + 7 = 12.\nAnswer: 12", 12.0),  # the asked-for form
        ("Answer: 1,234.", 1234.0),  # thousands separator, trailing period
        ("The answer is $45.", 45.0),  # dollars
        ("steps... #### -3", -3.0),  # GSM8K's marker, negative
        ("first 4, then 9, so 13", 13.0),  # no marker: the last number
        ("I do not know", None),
    ],
)
def test_extract_answer(text, expected):
    assert corpus.extract_answer(text) == expected


def test_generated_sets_are_seeded():
    assert corpus.generated_passages(30, 4) == corpus.generated_passages(30, 4)
    assert corpus.generated_passages(30, 4) != corpus.generated_passages(30, 5)
    problems = corpus.generated_problems(400, 1)
    assert len({p.question for p in problems}) > 390  # several hundred distinct problems
    assert all(p.answer == int(p.answer) and p.answer >= 0 for p in problems)
    assert corpus.problems_sha256(problems) != corpus.problems_sha256(corpus.generated_problems(400, 2))
    assert accuracy.parse_logprobs(
        {"meta_info": {"input_token_logprobs": [[None, 5, None], [-0.1, 7, "x"]],
                       "input_top_logprobs": [None, [[-0.1, 7, "x"], [-2.5, 3, "y"]]]}}, 2
    ) == {"token_ids": [5, 7], "top": [None, [[7, -0.1], [3, -2.5]]]}  # fmt: skip
