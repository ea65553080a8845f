"""`sglang-glm5 loadtest accuracy`: does the server still answer the same? KL divergence and task accuracy.

Two measurements, through the server's HTTP API only:
  KL      each corpus passage goes to SGLang's native /generate with `return_logprob: true`,
          `logprob_start_len: 0`, `top_logprobs_num: K` and one greedy output token. The answer's
          `meta_info.input_token_logprobs` ([logprob, token_id, text] per prompt token, logprob None
          for the first) gives the token ids; `meta_info.input_top_logprobs` (per prompt position,
          None for the first, else K [logprob, token_id, text] entries) is the teacher-forced
          next-token distribution. Both are saved (logprobs.jsonl.gz) and compared position by
          position with a reference: another server's run, or a file saved earlier. The token ids of
          both sides must be equal (same tokenizer, same text), else the command stops.
  tasks   arithmetic word problems (generated, or a GSM8K-style file) go to /v1/chat/completions,
          greedy; the last 'Answer: N' (else the last number) of the reply is compared with the exact
          answer.

Results go to OUT/TAG/accuracy/, next to `loadtest run`'s files (run `loadtest run` first: with
--overwrite it replaces the whole OUT/TAG folder):
    accuracy.json        what was run and the figures (accuracy_stats.py says how they are computed)
    answers.jsonl        one record per problem: gold, parsed answer, correct, error
    logprobs.jsonl.gz    a header line, then per passage: index, token ids, top-K lists (a reference)
    command.txt          the command that repeats this run
They are written to a temporary folder renamed into place at the end: a run stopped by an error
leaves no results behind. Requests that fail (after --retries) are counted in the results, which are
then marked incomplete, and the command exits 1.
"""

from __future__ import annotations

import argparse
import gzip
import http.client
import json
import os
import shlex
import shutil
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sglang_glm5._files import read_json
from sglang_glm5.loadtest import accuracy_stats as st
from sglang_glm5.loadtest import corpus
from sglang_glm5.loadtest.accuracy_report import (
    ANSWERS,
    FOLDER,
    LOGPROBS,
    LOGPROBS_FORMAT,
    LOGPROBS_VERSION,
    SUMMARY,
    compare_logprobs,
    pair_answers,
    read_logprobs,
    summary_lines,
)
from sglang_glm5.loadtest.metrics import RUN_FILE
from sglang_glm5.loadtest.runner import (
    API_KEY_ENV,
    ServerDown,
    check_health,
    served_model,
    server_info,
    server_url,
)

DEFAULT_TOP_K = 20
DEFAULT_BASELINE_TAG = "baseline"
RETRY_BACKOFF_S = 0.5  # first retry after this, then doubling, at most 4 s


class RequestFailed(Exception):
    """One request failed after its retries; the message is the counted reason."""


class UnusableReply(Exception):
    """The server answered, but not in the format expected (e.g. no prompt logprobs)."""


@dataclass
class Client:
    """Blocking JSON POSTs with retries; once the server is found down, every later request fails at once."""

    host: str
    api_key: str | None
    timeout: float
    retries: int
    backoff_s: float = RETRY_BACKOFF_S
    down: threading.Event = field(default_factory=threading.Event)

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        if self.down.is_set():
            raise RequestFailed("server down (skipped)")
        reason = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(min(self.backoff_s * 2 ** (attempt - 1), 4.0))
            try:
                status, data = self._send(path, body)
            except TimeoutError:
                raise RequestFailed(f"timeout: no data for {self.timeout:g} s") from None
            except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
                inner = e.reason if isinstance(e, urllib.error.URLError) else e
                if isinstance(inner, TimeoutError):
                    raise RequestFailed(f"timeout: no data for {self.timeout:g} s") from None
                reason = f"connection error: {getattr(inner, 'strerror', None) or inner or type(inner).__name__}"
                continue
            if status == 200:
                try:
                    reply = json.loads(data)
                except ValueError:
                    raise RequestFailed(f"reply is not JSON: {data[:80]!r}") from None
                if not isinstance(reply, dict):
                    raise RequestFailed(f"reply is not a JSON object: {data[:80]!r}")
                return reply
            reason = f"HTTP {status}: {data[:120].decode(errors='replace')}"
            if status < 500:
                raise RequestFailed(reason)
        if reason.startswith("connection error"):
            try:
                check_health(self.host, self.api_key, timeout=5.0)
            except ServerDown:
                self.down.set()
        raise RequestFailed(reason)

    def _send(self, path: str, body: dict[str, Any]) -> tuple[int, bytes]:
        req = urllib.request.Request(f"{self.host}{path}", data=json.dumps(body).encode(), method="POST")
        req.add_header("Content-Type", "application/json")
        if self.api_key:
            req.add_header("Authorization", f"Bearer {self.api_key}")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()


# --- KL: prompt logprobs ---------------------------------------------------------------------------


def logprob_body(text: str, top_k: int) -> dict[str, Any]:
    return {
        "text": text,
        "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
        "return_logprob": True,
        "logprob_start_len": 0,
        "top_logprobs_num": top_k,
        "stream": False,
    }


def parse_logprobs(reply: dict[str, Any], top_k: int) -> dict[str, Any]:
    """SGLang's meta_info -> {"token_ids": [...], "top": [None | [[id, logprob], ...]]} (one per prompt token)."""
    meta = reply.get("meta_info")
    if not isinstance(meta, dict) or "input_token_logprobs" not in meta or "input_top_logprobs" not in meta:
        keys = sorted(meta) if isinstance(meta, dict) else sorted(reply)
        raise UnusableReply(f"no meta_info.input_token_logprobs / input_top_logprobs in the reply (keys: {keys[:8]})")
    tokens, tops = meta["input_token_logprobs"], meta["input_top_logprobs"]
    if not isinstance(tokens, list) or not isinstance(tops, list) or len(tokens) != len(tops) or len(tokens) < 2:
        raise UnusableReply(f"input_token_logprobs ({_len(tokens)}) and input_top_logprobs ({_len(tops)}) "
                            "must be lists of the same length, at least 2")  # fmt: skip
    try:
        token_ids = [int(entry[1]) for entry in tokens]
        top: list[list[list[float]] | None] = []
        for entry in tops:
            if entry is None or len(entry) == 0:
                top.append(None)
                continue
            row = [[int(e[1]), float(e[0])] for e in entry]
            if len(row) > top_k:
                raise UnusableReply(f"{len(row)} top logprobs at a position (asked for {top_k})")
            top.append(row)
    except (TypeError, IndexError, KeyError, ValueError) as e:
        raise UnusableReply(f"a logprob entry is not [logprob, token_id, text] ({type(e).__name__}: {e})") from None
    if all(t is None for t in top):
        raise UnusableReply("input_top_logprobs holds no distribution (was top_logprobs_num ignored?)")
    return {"token_ids": token_ids, "top": top}


def _len(x: object) -> str:
    return str(len(x)) if isinstance(x, list) else type(x).__name__


# --- tasks -----------------------------------------------------------------------------------------


def chat_body(problem: corpus.Problem, model: str, max_tokens: int, thinking: bool) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": corpus.PROMPT.format(question=problem.question)}],
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": False,
        "chat_template_kwargs": {"enable_thinking": thinking},
    }


def grade(problem: corpus.Problem, reply: dict[str, Any]) -> dict[str, Any]:
    try:
        choice = reply["choices"][0]
        message = choice["message"]
    except (KeyError, IndexError, TypeError):
        raise RequestFailed(f"no choices[0].message in the reply: {json.dumps(reply)[:100]}") from None
    if not isinstance(message, dict) or not isinstance(choice, dict):
        raise RequestFailed(f"choices[0].message is not an object: {json.dumps(reply)[:100]}")
    content = message.get("content") or ""
    answer = corpus.extract_answer(content)
    if answer is None and message.get("reasoning_content"):
        answer = corpus.extract_answer(message["reasoning_content"])
    correct = answer is not None and abs(answer - problem.answer) <= 1e-6 * max(1.0, abs(problem.answer))
    usage = reply.get("usage") or {}
    return {"id": problem.id, "gold": problem.answer, "answer": answer, "correct": correct, "error": None,
            "finish_reason": choice.get("finish_reason"), "output_tokens": usage.get("completion_tokens"),
            "tail": content[-160:]}  # fmt: skip


# --- running ---------------------------------------------------------------------------------------


def _pool(
    items: list[Any], fn: Callable[[Any], Any], workers: int, label: str, done: int = 0
) -> Iterator[tuple[Any, Any]]:
    """(item, result or RequestFailed) as they complete, with a progress line every 10 s and at the end.

    `done` items were handled before (they count in the progress lines).
    """
    t0 = last = time.monotonic()
    total = done + len(items)
    failed = 0
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        futures = {pool.submit(fn, item): item for item in items}
        for fut in as_completed(futures):
            try:
                result = fut.result()
            except RequestFailed as e:
                result = e
            done += 1
            failed += isinstance(result, RequestFailed)
            now = time.monotonic()
            if now - last >= 10.0 or done == total:
                last = now
                print(f"  {label}: {done}/{total} done, {failed} failed, {now - t0:.0f} s", flush=True)
            yield futures[fut], result


@dataclass
class Side:
    host: str
    tag: str


def _texts(args: argparse.Namespace) -> tuple[list[str], dict[str, Any]]:
    if args.corpus:
        passages = corpus.read_corpus(Path(args.corpus))
        source = str(args.corpus)
    else:
        passages = corpus.generated_passages(args.passages, args.seed)
        source = f"generated (seed {args.seed}, {args.passages} passages)"
    return passages, {"source": source, "passages": len(passages), "sha256": corpus.texts_sha256(passages)}


def _problems(args: argparse.Namespace) -> tuple[list[corpus.Problem], dict[str, Any]]:
    if args.dataset:
        problems = corpus.read_dataset(Path(args.dataset))
        source = str(args.dataset)
    else:
        problems = corpus.generated_problems(args.problems, args.seed)
        source = f"generated (seed {args.seed}, {args.problems} problems)"
    return problems, {"source": source, "count": len(problems), "sha256": corpus.problems_sha256(problems)}


def _reference(spec: str | None) -> tuple[Path | None, Path | None]:
    """--reference: a results folder (TAG, OUT/TAG or its accuracy/) or a logprobs file -> (logprobs, answers)."""
    if not spec:
        return None, None
    path = Path(spec)
    for folder in (path / FOLDER, path, Path("loadtest_results") / spec / FOLDER):
        found = [folder / name if (folder / name).exists() else None for name in (LOGPROBS, ANSWERS)]
        if folder.is_dir() and any(found):
            return found[0], found[1]
    if path.is_file():
        return path, None
    raise ValueError(f"--reference {spec}: expected a results folder holding {FOLDER}/{LOGPROBS} or "
                     f"{FOLDER}/{ANSWERS}, or a {LOGPROBS} file")  # fmt: skip


def canonical_command(args: argparse.Namespace, side: Side, reference: str | None) -> str:
    parts = ["sglang-glm5", "loadtest", "accuracy", "--host", side.host, "--tag", side.tag, "--out", args.out]
    parts += ["--concurrency", str(args.concurrency), "--request-timeout", f"{args.request_timeout:g}"]
    parts += ["--retries", str(args.retries), "--seed", str(args.seed), "--top-logprobs", str(args.top_logprobs)]
    parts += ["--passages", str(args.passages), "--problems", str(args.problems), "--max-tokens", str(args.max_tokens)]
    for flag, value in (("--corpus", args.corpus), ("--dataset", args.dataset), ("--model", args.model),
                        ("--reference", reference)):  # fmt: skip
        if value:
            parts += [flag, str(value)]
    parts += ["--thinking"] if args.thinking else []
    parts += ["--no-kl"] if args.no_kl else []
    parts += ["--no-tasks"] if args.no_tasks else []
    return shlex.join(parts)


def measure(args: argparse.Namespace, side: Side, reference: str | None) -> int:
    """One server: write OUT/TAG/accuracy/; 0 when complete, 1 when requests failed; ValueError for user errors."""
    host = side.host.rstrip("/")
    api_key = args.api_key or os.environ.get(API_KEY_ENV) or None
    final = Path(args.out) / side.tag / FOLDER
    if final.exists() and not args.overwrite:
        raise ValueError(f"{final} exists; pick another --tag or pass --overwrite")
    ref_logprobs, ref_answers = _reference(reference)
    passages, corpus_meta = _texts(args) if not args.no_kl else ([], None)
    problems, problems_meta = _problems(args) if not args.no_tasks else ([], None)
    ref_header, ref_records = read_logprobs(ref_logprobs) if ref_logprobs and passages else (None, None)
    if ref_header is not None:
        if ref_header.get("corpus_sha256") != corpus_meta["sha256"]:
            raise ValueError(f"reference {ref_logprobs} was recorded on another corpus ({ref_header.get('corpus')}); "
                             "pass the same --corpus, or --passages and --seed, as that run")  # fmt: skip
        if ref_header.get("top_logprobs_num") != args.top_logprobs:
            raise ValueError(f"reference {ref_logprobs} holds top-{ref_header.get('top_logprobs_num')} logprobs; "
                             f"pass --top-logprobs {ref_header.get('top_logprobs_num')}")  # fmt: skip
    try:
        check_health(host, api_key)
    except ServerDown as e:
        raise ValueError(str(e)) from None
    info = server_info(host, api_key)
    model = args.model or served_model(host, api_key) or info.get("model_path") or "default"
    client = Client(host, api_key, args.request_timeout, args.retries, args.retry_backoff)
    started = datetime.now(UTC).isoformat(timespec="seconds")
    print(f"accuracy {side.tag}: {host}, model {model}; {len(passages)} passages (top-{args.top_logprobs} "
          f"logprobs), {len(problems)} problems, {args.concurrency} at a time", flush=True)  # fmt: skip

    tmp = final.parent / f".{FOLDER}.partial-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        summary: dict[str, Any] = {"tag": side.tag, "host": host, "model": model,
                                   "model_path": info.get("model_path", model), "started": started}  # fmt: skip
        failures = 0
        if passages:
            kl, n_failed = _run_kl(client, passages, corpus_meta, args, tmp, side, host, model)
            if ref_records is not None:
                _, records = read_logprobs(tmp / LOGPROBS)
                kl["reference"] = {"path": str(ref_logprobs), "tag": ref_header.get("tag")}
                kl["vs_reference"] = compare_logprobs(ref_records, records)
            summary["kl"] = kl
            failures += n_failed
        if problems:
            tasks, n_failed = _run_tasks(client, problems, problems_meta, args, tmp, side.tag, model, ref_answers)
            summary["tasks"] = tasks
            failures += n_failed
        summary["failed_requests"] = failures
        summary["complete"] = failures == 0
        summary["finished"] = datetime.now(UTC).isoformat(timespec="seconds")
        summary["command"] = canonical_command(args, side, reference)
        (tmp / "command.txt").write_text(summary["command"] + "\n")
        (tmp / SUMMARY).write_text(json.dumps(summary, indent=2) + "\n")
        if final.exists():
            shutil.rmtree(final)
        tmp.rename(final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for line in summary_lines(summary):
        print(f"accuracy {side.tag}: {line}")
    print(
        f"accuracy {side.tag}: wrote {final}/" + ("" if not failures else f" (INCOMPLETE: {failures} failed requests)")
    )
    return 0 if failures == 0 else 1


def _run_kl(client: Client, passages: list[str], corpus_meta: dict[str, Any], args: argparse.Namespace, tmp: Path,
            side: Side, host: str, model: str) -> tuple[dict[str, Any], int]:  # fmt: skip
    k = args.top_logprobs
    # The first passage alone: a server without prompt logprobs is a user error, not a run of failures.
    try:
        first = parse_logprobs(client.post("/generate", logprob_body(passages[0], k)), k)
    except (RequestFailed, UnusableReply) as e:
        raise ValueError(f"{host} cannot score prompts: /generate with return_logprob, logprob_start_len and "
                         f"top_logprobs_num: {e} (expected an SGLang server)") from None  # fmt: skip

    def one(i: int) -> dict[str, Any]:
        try:
            return parse_logprobs(client.post("/generate", logprob_body(passages[i], k)), k)
        except UnusableReply as e:
            raise RequestFailed(f"malformed logprobs: {e}") from None

    records: dict[int, dict[str, Any]] = {0: {"i": 0, **first}}
    errors: dict[str, int] = {}
    for i, result in _pool(list(range(1, len(passages))), one, args.concurrency, f"{side.tag} KL passages", done=1):
        if isinstance(result, RequestFailed):
            errors[str(result)] = errors.get(str(result), 0) + 1
        else:
            records[i] = {"i": i, **result}
    header = {"format": LOGPROBS_FORMAT, "version": LOGPROBS_VERSION, "tag": side.tag, "host": host, "model": model,
              "top_logprobs_num": k, "corpus": corpus_meta["source"], "corpus_sha256": corpus_meta["sha256"],
              "passages": len(passages)}  # fmt: skip
    with gzip.open(tmp / LOGPROBS, "wt", encoding="utf-8") as f:
        f.write(json.dumps(header) + "\n")
        for i in sorted(records):
            f.write(json.dumps(records[i], separators=(",", ":")) + "\n")
    n_failed = len(passages) - len(records)
    kl: dict[str, Any] = {"corpus": corpus_meta, "top_logprobs_num": k, "passages_ok": len(records),
                          "passages_failed": n_failed, "failure_kinds": errors,
                          "positions_per_passage_mean": sum(len(r["token_ids"]) for r in records.values())
                          / len(records)}  # fmt: skip
    return kl, n_failed


def _run_tasks(client: Client, problems: list[corpus.Problem], meta: dict[str, Any], args: argparse.Namespace,
               tmp: Path, tag: str, model: str, ref_answers: Path | None) -> tuple[dict[str, Any], int]:  # fmt: skip
    def one(p: corpus.Problem) -> dict[str, Any]:
        return grade(p, client.post("/v1/chat/completions", chat_body(p, model, args.max_tokens, args.thinking)))

    rows: dict[str, dict[str, Any]] = {}
    errors: dict[str, int] = {}
    for p, result in _pool(problems, one, args.concurrency, f"{tag} problems"):
        if isinstance(result, RequestFailed):
            errors[str(result)] = errors.get(str(result), 0) + 1
            rows[p.id] = {"id": p.id, "gold": p.answer, "answer": None, "correct": False, "error": str(result)}
        else:
            rows[p.id] = result
    ordered = [rows[p.id] for p in problems]
    with (tmp / ANSWERS).open("w") as f:
        for r in ordered:
            f.write(json.dumps(r) + "\n")
    answered = [r for r in ordered if r["error"] is None]
    correct = sum(r["correct"] for r in answered)
    lo, hi = st.wilson(correct, len(answered))
    tasks: dict[str, Any] = {"problems": meta, "max_tokens": args.max_tokens, "thinking": args.thinking,
                             "answered": len(answered), "failed": len(ordered) - len(answered),
                             "failure_kinds": errors, "correct": correct,
                             "accuracy": correct / len(answered) if answered else None,
                             "interval_95": [lo, hi] if answered else None, "interval_method": "Wilson score",
                             "hit_max_tokens": sum(r.get("finish_reason") == "length" for r in answered),
                             "no_answer_found": sum(r["answer"] is None for r in answered)}  # fmt: skip
    if ref_answers is not None:
        ref_rows = [json.loads(x) for x in ref_answers.read_text().splitlines() if x.strip()]
        if {r["id"] for r in ref_rows} == {p.id for p in problems}:
            tasks["vs_reference"] = {"path": str(ref_answers), **pair_answers(ref_rows, ordered)}
        else:
            tasks["vs_reference"] = {"path": str(ref_answers), "error": "the reference answered other problems"}
    return tasks, len(ordered) - len(answered)


# --- command ---------------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    if args.no_kl and args.no_tasks:
        raise ValueError("--no-kl and --no-tasks together leave nothing to measure")
    if args.baseline_host and args.reference:
        raise ValueError("--baseline-host and --reference both name the reference; give one")
    if args.baseline_host and args.baseline_tag is None:
        args.baseline_host = server_url("--baseline-host", args.baseline_host)
        args.baseline_tag = baseline_tag(Path(args.out), args.baseline_host, args.tag)
    if args.baseline_host and args.baseline_tag == args.tag:
        raise ValueError(f"--baseline-tag and --tag are both {args.tag!r}; the two servers need two folders")
    if min(args.concurrency, args.top_logprobs, args.max_tokens, args.passages, args.problems) < 1 or args.retries < 0:
        raise ValueError(
            "--concurrency, --top-logprobs, --max-tokens, --passages and --problems must be >= 1, --retries >= 0"
        )
    if not 0 <= args.retry_backoff < float("inf"):
        raise ValueError(f"--retry-backoff {args.retry_backoff:g}: expected a number of seconds >= 0")
    if not 0 < args.request_timeout < float("inf"):
        raise ValueError(f"--request-timeout {args.request_timeout:g}: expected a positive number of seconds")
    args.host = server_url("--host", args.host)
    if args.baseline_host:
        args.baseline_host = server_url("--baseline-host", args.baseline_host)
    for tag in (args.tag, args.baseline_tag if args.baseline_host else None):
        if tag and (Path(args.out) / tag / FOLDER).exists() and not args.overwrite:
            raise ValueError(f"{Path(args.out) / tag / FOLDER} exists; pick another --tag or pass --overwrite")
    status = 0
    reference = args.reference
    if args.baseline_host:
        status = measure(args, Side(args.baseline_host, args.baseline_tag), None)
        reference = str(Path(args.out) / args.baseline_tag)
    return max(status, measure(args, Side(args.host, args.tag), reference))


def baseline_tag(out: Path, baseline_host: str, tag: str) -> str:
    """``--baseline-tag`` when not given: the results folder under ``out`` (other than ``tag``) whose throughput run
    (``loadtest run``, its run.json) loaded ``baseline_host``, so that `loadtest compare` finds both parts of the
    baseline in one folder; DEFAULT_BASELINE_TAG when there is none. ValueError when several did."""
    found = []
    for run_file in sorted(out.glob(f"*/{RUN_FILE}")):
        try:
            host = str(read_json(run_file).get("host", "")).rstrip("/")
        except (OSError, ValueError):
            continue
        if host == baseline_host and run_file.parent.name != tag:
            found.append(run_file.parent.name)
    if len(found) > 1:
        raise ValueError(f"--baseline-host {baseline_host}: the throughput runs {', '.join(found)} under {out} all "
                         "loaded it; name the baseline's folder with --baseline-tag")  # fmt: skip
    chosen = found[0] if found else DEFAULT_BASELINE_TAG
    why = f"the throughput run in {out / chosen} loaded {baseline_host}" if found else "no throughput run loaded it"
    print(f"accuracy: --baseline-tag {chosen} ({why})")
    return chosen


def add_cli(sub: argparse._SubParsersAction, cmd: Callable[[argparse.Namespace], int]) -> None:
    a = sub.add_parser(
        "accuracy",
        help="KL divergence (teacher-forced prompt logprobs) and task accuracy of a server, against a reference",
        description="Scores a corpus through /generate's prompt logprobs and asks arithmetic word problems through "
        "/v1/chat/completions (greedy); writes OUT/TAG/accuracy/. With --reference (a results folder or a saved "
        "logprobs file) or --baseline-host (a second live server, measured first), also reports KL(reference || "
        "this server), top-1 agreement, and the paired accuracy difference. `loadtest compare` then shows them "
        "beside the throughput gain. Run it after `loadtest run` for the same tag.",
    )
    a.add_argument("--host", required=True, help="server URL (the patched one in an A/B)")
    a.add_argument("--tag", required=True, help="results folder name under --out, e.g. patched")
    a.add_argument("--out", default="loadtest_results", help="parent folder of results (loadtest_results)")
    a.add_argument(
        "--reference", default=None, help="a results folder (or its logprobs.jsonl.gz) to compare with, e.g. OUT/bf16"
    )
    a.add_argument("--baseline-host", default=None, help="a second server, measured first as --baseline-tag")
    a.add_argument(
        "--baseline-tag", default=None,
        help="results folder of --baseline-host (default: the folder under --out whose `loadtest run` loaded that "
        f"server, else {DEFAULT_BASELINE_TAG})",
    )  # fmt: skip
    a.add_argument("--corpus", default=None, help="text passages separated by blank lines, or JSONL with 'text'")
    a.add_argument("--passages", type=int, default=corpus.DEFAULT_PASSAGES, help="generated passages (200)")
    a.add_argument("--top-logprobs", type=int, default=DEFAULT_TOP_K, help="top-k logprobs per position (20)")
    a.add_argument("--dataset", default=None, help="GSM8K-style JSONL with question and answer fields")
    a.add_argument("--problems", type=int, default=corpus.DEFAULT_PROBLEMS, help="generated problems (300)")
    a.add_argument("--seed", type=int, default=0, help="seed of the generated passages and problems (0)")
    a.add_argument("--max-tokens", type=int, default=1024, help="output tokens per problem (1024)")
    a.add_argument("--thinking", action="store_true", help="let the model think (chat_template_kwargs enable_thinking)")
    a.add_argument("--no-kl", action="store_true", help="skip the KL part")
    a.add_argument("--no-tasks", action="store_true", help="skip the task-accuracy part")
    a.add_argument("--concurrency", type=int, default=16, help="requests in flight (16)")
    a.add_argument("--request-timeout", type=float, default=600.0, help="seconds without data before a request fails")
    a.add_argument("--retries", type=int, default=2, help="retries of a request after a connection error or HTTP 5xx")
    a.add_argument("--retry-backoff", type=float, default=RETRY_BACKOFF_S, metavar="SECONDS",
                   help=f"the wait before the first retry, doubling for each next one, at most 4 s "
                   f"(default {RETRY_BACKOFF_S:g})")
    a.add_argument("--model", default=None, help="model name for chat requests (default: the server's /v1/models)")
    a.add_argument("--api-key", default=None, help=f"Bearer token (default: ${API_KEY_ENV})")
    a.add_argument("--overwrite", action="store_true", help="replace an existing TAG/accuracy/ folder")
    a.set_defaults(func=cmd)
