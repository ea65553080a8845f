"""The records of `loadtest accuracy` and the figures drawn from them: files, comparisons, report text.

A results folder's accuracy/ holds accuracy.json (the run and its figures), answers.jsonl (one
record per problem) and logprobs.jsonl.gz (a header line, then per passage its index, token ids and
top-k [token id, logprob] lists, None where the server gives no distribution). `loadtest compare`
recomputes the paired accuracy difference and KL(baseline || patched) from those records (section),
and states the throughput gain beside them (markdown_lines).
"""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path
from typing import Any

from sglang_glm5.loadtest import accuracy_stats as st

FOLDER = "accuracy"
SUMMARY = "accuracy.json"
ANSWERS = "answers.jsonl"
LOGPROBS = "logprobs.jsonl.gz"
LOGPROBS_FORMAT = "sglang-glm5 prompt logprobs"
LOGPROBS_VERSION = 1


def read_logprobs(path: Path) -> tuple[dict[str, Any], dict[int, dict[str, Any]]]:
    """(header, {passage index: record}) of a logprobs.jsonl.gz."""
    try:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            header = json.loads(f.readline())
            if not isinstance(header, dict) or header.get("format") != LOGPROBS_FORMAT:
                raise ValueError(f"reference {path}: not a saved logprobs file (expected a header with format "
                                 f"{LOGPROBS_FORMAT!r})")  # fmt: skip
            records = {}
            for line in f:
                if line.strip():
                    rec = json.loads(line)
                    records[int(rec["i"])] = rec
    except (OSError, EOFError, json.JSONDecodeError, KeyError, TypeError) as e:
        raise ValueError(
            f"reference {path}: cannot read it as gzipped JSONL logprobs ({type(e).__name__}: {e})"
        ) from None
    return header, records


def compare_logprobs(base: dict[int, dict[str, Any]], patched: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """KL(base || patched) per position over the passages both hold; ValueError when token ids differ."""
    kls: list[float] = []
    agree = 0
    tail = 0.0
    common = sorted(base.keys() & patched.keys())
    for i in common:
        b, p = base[i], patched[i]
        if b["token_ids"] != p["token_ids"]:
            j = next((j for j, (x, y) in enumerate(zip(b["token_ids"], p["token_ids"], strict=False)) if x != y),
                     min(len(b["token_ids"]), len(p["token_ids"])))  # fmt: skip
            raise ValueError(
                f"token ids differ in passage {i} at position {j} ({len(b['token_ids'])} vs {len(p['token_ids'])} "
                "tokens): the two sides do not share a tokenizer, or the reference was recorded on other text"
            )
        for bt, pt in zip(b["top"], p["top"], strict=True):
            if bt is None or pt is None:
                continue
            kls.append(st.position_kl(bt, pt))
            agree += st.top1(bt) == st.top1(pt)
            tail += max(0.0, 1.0 - sum(math.exp(lp) for _, lp in bt))
    n = len(kls)
    return {
        "passages": len(common),
        "positions": n,
        "mean": sum(kls) / n if n else None,
        "p99": st.percentile(kls, 99) if n else None,
        "max": max(kls) if n else None,
        "top1_agreement": agree / n if n else None,
        "baseline_tail_mass_mean": tail / n if n else None,
    }


def pair_answers(base: list[dict[str, Any]], patched: list[dict[str, Any]]) -> dict[str, Any]:
    """Paired accuracy difference (patched - baseline) over problems both answered."""
    b = {r["id"]: r["correct"] for r in base if r.get("error") is None}
    p = {r["id"]: r["correct"] for r in patched if r.get("error") is None}
    ids = b.keys() & p.keys()
    both = sum(b[i] and p[i] for i in ids)
    base_only = sum(b[i] and not p[i] for i in ids)
    patched_only = sum(p[i] and not b[i] for i in ids)
    neither = len(ids) - both - base_only - patched_only
    d = st.paired_difference(both, base_only, patched_only, neither)
    verdict = "n/a"
    if d["n"]:
        verdict = "dropped" if d["high"] < 0 else "improved" if d["low"] > 0 else "same"
    return {**d, "both": both, "baseline_only": base_only, "patched_only": patched_only, "neither": neither,
            "verdict": verdict}  # fmt: skip


# --- text ------------------------------------------------------------------------------------------


def _pct(x: float) -> str:
    return f"{100 * x:+.1f}"


def kl_text(v: dict[str, Any]) -> str:
    if not v.get("positions"):
        return "no position scored by both sides"
    return (f"KL mean {v['mean']:.4g}, p99 {v['p99']:.4g}, top-1 agreement {100 * v['top1_agreement']:.2f}% "
            f"({v['positions']} positions, {v['passages']} passages)")  # fmt: skip


def diff_text(d: dict[str, Any]) -> str:
    if not d.get("n"):
        return "no problem answered by both"
    words = {"dropped": "ACCURACY DROPPED beyond the interval", "improved": "accuracy rose beyond the interval",
             "same": "same accuracy within the interval"}  # fmt: skip
    return (f"{_pct(d['diff'])} points [{_pct(d['low'])}, {_pct(d['high'])}] (Newcombe paired 95%, {d['n']} "
            f"problems): {words[d['verdict']]}")  # fmt: skip


def accuracy_text(t: dict[str, Any]) -> str:
    if not t.get("answered"):
        return "no problem answered"
    lo, hi = t["interval_95"]
    return f"{t['correct']}/{t['answered']} correct = {t['accuracy']:.3f} [{lo:.3f}, {hi:.3f}] (Wilson 95%)"


def summary_lines(s: dict[str, Any]) -> list[str]:
    lines = []
    if "kl" in s:
        kl = s["kl"]
        line = f"KL: {kl['passages_ok']} passages scored, {kl['passages_failed']} failed"
        if "vs_reference" in kl:
            line += f"; vs {kl['reference']['tag'] or kl['reference']['path']}: {kl_text(kl['vs_reference'])}"
        lines.append(line)
    if "tasks" in s:
        t = s["tasks"]
        lines.append(f"tasks: {accuracy_text(t)}, {t['failed']} failed, {t['hit_max_tokens']} hit --max-tokens, "
                     f"{t['no_answer_found']} without a number")  # fmt: skip
        ref = t.get("vs_reference")
        if ref:
            lines.append(f"tasks vs reference: {ref.get('error') or diff_text(ref)}")
    return lines


# --- compare ---------------------------------------------------------------------------------------


def load(folder: Path) -> dict[str, Any] | None:
    """A folder's accuracy.json; None when it has none; ValueError when it cannot be read."""
    path = folder / FOLDER / SUMMARY
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: cannot read it ({type(e).__name__}: {e})") from None


def read_answers(folder: Path) -> list[dict[str, Any]]:
    path = folder / FOLDER / ANSWERS
    try:
        return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: cannot read it ({type(e).__name__}: {e})") from None


def section(base_dir: Path, patched_dir: Path) -> dict[str, Any]:
    """The accuracy part of `loadtest compare`, recomputed from both folders' answers and logprobs.

    Never raises for the accuracy records: what cannot be compared becomes a note in the report.
    """
    out: dict[str, Any] = {"baseline": None, "patched": None, "kl": None, "tasks": None, "notes": []}
    try:
        b, p = load(base_dir), load(patched_dir)
    except ValueError as e:
        out["notes"].append(f"accuracy not compared: {e}")
        return out
    out["baseline"], out["patched"] = b, p
    if b is None or p is None:
        missing = [str(d) for d, s in ((base_dir, b), (patched_dir, p)) if s is None]
        out["notes"].append(f"accuracy not measured in {', '.join(missing)} (run `sglang-glm5 loadtest accuracy`)")
        return out
    for side, s in (("baseline", b), ("patched", p)):
        if not s.get("complete", False):
            out["notes"].append(f"{side} accuracy run is INCOMPLETE ({s.get('failed_requests')} failed requests)")
    if "kl" in b and "kl" in p:
        if b["kl"]["corpus"]["sha256"] != p["kl"]["corpus"]["sha256"]:
            out["notes"].append("KL not computed: the two runs scored different corpora")
        else:
            try:
                _, rb = read_logprobs(base_dir / FOLDER / LOGPROBS)
                _, rp = read_logprobs(patched_dir / FOLDER / LOGPROBS)
                out["kl"] = compare_logprobs(rb, rp)
            except ValueError as e:
                out["notes"].append(f"KL not computed: {e}")
    if "tasks" in b and "tasks" in p:
        if b["tasks"]["problems"]["sha256"] != p["tasks"]["problems"]["sha256"]:
            out["notes"].append("accuracy difference not computed: the two runs asked different problems")
        else:
            try:
                out["tasks"] = pair_answers(read_answers(base_dir), read_answers(patched_dir))
            except ValueError as e:
                out["notes"].append(f"accuracy difference not computed: {e}")
    return out


def markdown_lines(acc: dict[str, Any], gain: float) -> list[str]:
    """The lines `compare` puts under the throughput gain: the gain at (or not at) the same accuracy."""
    kl, tasks = acc["kl"], acc["tasks"]
    b, p = acc["baseline"], acc["patched"]
    parts = []
    if kl and kl.get("positions"):
        parts.append(
            f"KL {kl['mean']:.4g} mean, {kl['p99']:.4g} p99, top-1 agreement {100 * kl['top1_agreement']:.1f}%"
        )
    if tasks and tasks["n"]:
        parts.append(f"accuracy {b['tasks']['accuracy']:.3f} -> {p['tasks']['accuracy']:.3f}, "
                     f"{_pct(tasks['diff'])} points [{_pct(tasks['low'])}, {_pct(tasks['high'])}]")  # fmt: skip
    g = f"{gain:.2f}x the throughput"
    if tasks and tasks["verdict"] == "dropped":
        head = f"**{g}, but ACCURACY DROPPED beyond the 95% interval** ({'; '.join(parts)})"
    elif tasks and tasks["n"]:
        head = f"**{g} at the same accuracy** ({'; '.join(parts)})"
    elif parts:
        head = f"**{g}**; task accuracy not compared ({'; '.join(parts)})"
    else:
        head = f"**{g}**; accuracy not compared"
    lines = ["", head]
    if tasks and tasks["n"]:
        lines += ["", f"Accuracy: baseline {accuracy_text(b['tasks'])}; patched {accuracy_text(p['tasks'])}; "
                  f"difference {diff_text(tasks)}. Problems: {b['tasks']['problems']['source']}."]  # fmt: skip
    if kl and kl.get("positions"):
        lines += ["", f"Teacher-forced KL(baseline || patched) over top-{b['kl']['top_logprobs_num']} support, the "
                  f"tail lumped into one bucket: {kl_text(kl)}; mean baseline mass outside its top-"
                  f"{b['kl']['top_logprobs_num']}: {kl['baseline_tail_mass_mean']:.3g}. "
                  f"Corpus: {b['kl']['corpus']['source']}."]  # fmt: skip
    lines += [f"\nNote: {n}" for n in acc["notes"]]
    return lines
