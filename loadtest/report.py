"""`sglang-glm5 loadtest compare BASELINE PATCHED`: the gain, recomputed from both folders' records.

Gain at a level = mean patched throughput / mean baseline throughput over the repeats; its spread is
[min patched / max baseline, max patched / min baseline], the worst and best pairing of repeats.
Runs with different workloads (lengths, seed, prompt file content, mode, duration) or different
models are refused: their throughputs do not measure the same thing.
When both folders hold `loadtest accuracy` results, the gain is stated beside the paired accuracy
difference and the KL divergence between the two servers (accuracy_report.section, from their records).
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
from pathlib import Path
from typing import Any

from sglang_glm5.loadtest import accuracy_report, metrics
from sglang_glm5.loadtest.workload import Workload

DEFAULT_PARENT = Path("loadtest_results")
PLOTS = ("throughput.png", "latency.png", "gain.png")


def resolve(name: str) -> Path:
    path = Path(name)
    if path.is_dir():
        return path
    if (DEFAULT_PARENT / name).is_dir():
        return DEFAULT_PARENT / name
    raise ValueError(f"{name}: no such results folder (nor {DEFAULT_PARENT / name})")


def check_comparable(base: dict[str, Any], patched: dict[str, Any]) -> None:
    """Raise ValueError naming every difference that makes the two runs incomparable."""
    diffs = []
    wb = Workload.from_dict(base["workload"]).comparable_dict()
    wp = Workload.from_dict(patched["workload"]).comparable_dict()
    diffs += [f"{k} {wb[k]!r} vs {wp[k]!r}" for k in wb if wb[k] != wp[k]]
    if base["duration_s"] != patched["duration_s"]:
        diffs.append(f"duration {base['duration_s']:g} s vs {patched['duration_s']:g} s")
    if diffs:
        raise ValueError("refusing to compare runs with different workloads: " + "; ".join(diffs))
    mb, mp = base.get("model_path") or base.get("model"), patched.get("model_path") or patched.get("model")
    if mb != mp:
        raise ValueError(f"refusing to compare runs of different models: {mb!r} vs {mp!r}")


def gain(base: dict[str, Any], patched: dict[str, Any]) -> dict[str, float]:
    """Ratio of means, and the worst/best pairing of repeats."""
    if not base["values"] or base["mean"] <= 0 or min(base["values"]) <= 0:
        return {"mean": math.nan, "low": math.nan, "high": math.nan}
    return {
        "mean": patched["mean"] / base["mean"],
        "low": patched["min"] / base["max"],
        "high": patched["max"] / base["min"],
    }


def _fmt_gain(g: dict[str, float]) -> str:
    if math.isnan(g["mean"]):
        return "n/a"
    return f"**{g['mean']:.2f}x** ({g['low']:.2f}-{g['high']:.2f})"


def build(base_dir: Path, patched_dir: Path, slo: metrics.Slo) -> dict[str, Any]:
    mb, rb = metrics.load_results(base_dir)
    mp, rp = metrics.load_results(patched_dir)
    check_comparable(mb, mp)
    for folder, records in ((base_dir, rb), (patched_dir, rp)):
        if not any(r.get("ok") for r in records):
            raise ValueError(
                f"{folder}: no request of this run succeeded ({len(records)} recorded): nothing to compare"
            )
    sb, sp = metrics.summarize(mb, rb, slo), metrics.summarize(mp, rp, slo)
    levels = sorted(set(sb["levels"]) & set(sp["levels"]), key=int)
    if not levels:
        raise ValueError(f"no concurrency level in common: {sorted(sb['levels'])} vs {sorted(sp['levels'])}")
    rows = []
    for c in levels:
        b, p = sb["levels"][c], sp["levels"][c]
        rows.append({"concurrency": int(c), "baseline": b, "patched": p,
                     **{f"gain_{k}": gain(b[k], p[k]) for k in metrics.THROUGHPUTS}})  # fmt: skip
    acc = accuracy_report.section(base_dir, patched_dir)
    acc["notes"] += accuracy_gap_commands(acc, (base_dir, mb), (patched_dir, mp))
    return {"baseline": {"dir": str(base_dir), **mb}, "patched": {"dir": str(patched_dir), **mp},
            "slo": slo.as_dict(), "levels": rows, "accuracy": acc}  # fmt: skip


def accuracy_gap_commands(acc: dict[str, Any], base: tuple[Path, dict], patched: tuple[Path, dict]) -> list[str]:
    """The `loadtest accuracy` commands that fill the folders without accuracy results (``acc``: the section
    ``accuracy_report.section`` made), with the hosts their throughput runs loaded, for the report's notes."""
    (base_dir, mb), (patched_dir, mp) = base, patched
    both = acc["baseline"] is not None and acc["patched"] is not None
    if both or any("not compared" in n for n in acc["notes"]):
        return []

    def command(folder: Path, meta: dict, *more: str) -> str:
        return shlex.join(["sglang-glm5", "loadtest", "accuracy", "--host", str(meta.get("host", "URL")),
                           "--tag", folder.name, "--out", str(folder.parent), *more])  # fmt: skip

    if acc["baseline"] is None and acc["patched"] is None and mb.get("host") != mp.get("host"):
        baseline = ["--baseline-host", str(mb.get("host", "URL")), "--baseline-tag", base_dir.name]
        return ["to fill it, with both servers up: " + command(patched_dir, mp, *baseline)]
    notes = []
    if acc["baseline"] is None:
        notes.append("to fill it, with the baseline server up: " + command(base_dir, mb))
    if acc["patched"] is None:
        reference = ["--reference", str(base_dir)]
        notes.append("to fill it, with the patched server up: " + command(patched_dir, mp, *reference))
    return notes


def markdown(rep: dict[str, Any]) -> str:
    b, p, rows = rep["baseline"], rep["patched"], rep["levels"]
    w = b["workload"]
    gains = [r["gain_output_throughput"]["mean"] for r in rows if not math.isnan(r["gain_output_throughput"]["mean"])]
    geo = math.exp(sum(math.log(g) for g in gains) / len(gains)) if gains else math.nan
    lines = [
        f"# Load test: {p['tag']} vs {b['tag']}",
        "",
        f"Model `{b.get('model_path')}`; {w['mode']} mode, input {w['input_len']} words, output {w['output_len']} "
        f"tokens (range ratio {w['range_ratio']:g}, ignore_eos {w['ignore_eos']}), seed {w['seed']}; "
        f"{b['duration_s']:g} s per run; repeats {b['repeats']} (baseline) and {p['repeats']} (patched).",
        "",
        f"**Output-token throughput gain: {geo:.2f}x** (geometric mean over {len(rows)} concurrency levels; "
        "per level below, with the worst-best pairing of repeats in parentheses).",
        *(accuracy_report.markdown_lines(rep["accuracy"], geo) if "accuracy" in rep else []),
        "",
        "| users | baseline tok/s | patched tok/s | gain | req/s gain | TTFT p50 / p99 ms (base -> patched) "
        "| TPOT p50 / p99 ms (base -> patched) | failed (base / patched) |",
        "|---:|---:|---:|---|---|---|---|---|",
    ]
    for r in rows:
        bb, pp = r["baseline"], r["patched"]
        lines.append(
            f"| {r['concurrency']} | {_tp(bb)} | {_tp(pp)} | {_fmt_gain(r['gain_output_throughput'])} "
            f"| {_fmt_gain(r['gain_request_throughput'])} "
            f"| {_lat(bb['ttft_ms'])} -> {_lat(pp['ttft_ms'])} | {_lat(bb['tpot_ms'])} -> {_lat(pp['tpot_ms'])} "
            f"| {bb['failed']} / {pp['failed']} |"
        )
    slo = rep["slo"]
    if slo["ttft_ms"] is not None or slo["tpot_ms"] is not None:
        lines += ["", f"Goodput (requests/s with TTFT <= {slo['ttft_ms']} ms and TPOT <= {slo['tpot_ms']} ms):", ""]
        lines += ["| users | baseline req/s | patched req/s | gain |", "|---:|---:|---:|---|"]
        for r in rows:
            gb, gp = r["baseline"]["goodput"], r["patched"]["goodput"]
            lines.append(
                f"| {r['concurrency']} | {gb['mean']:.2f} | {gp['mean']:.2f} | {_fmt_gain(r['gain_goodput'])} |"
            )
    lines += ["", "ITL (ms, p50 / p99):", ""]
    lines += [f"- {r['concurrency']} users: {_lat(r['baseline']['itl_ms'])} -> {_lat(r['patched']['itl_ms'])}"
              for r in rows]  # fmt: skip
    fails = [(r["concurrency"], side, r[side]["failure_kinds"]) for r in rows for side in ("baseline", "patched")]
    if any(k for _, _, k in fails):
        lines += ["", "Failures:", ""]
        lines += [f"- {c} users, {side}: {kinds}" for c, side, kinds in fails if kinds]
    lines += ["", "Plots: " + ", ".join(f"![{name}]({name})" for name in PLOTS), ""]
    lines += ["Throughput: tokens arriving within each run's steady-state window (all users busy), successful "
              "requests only. Latencies: every successful request, pooled over repeats. Sources: "
              f"`{b['dir']}`, `{p['dir']}`.", ""]  # fmt: skip
    return "\n".join(lines)


def _tp(level: dict[str, Any]) -> str:
    t = level["output_throughput"]
    return f"{t['mean']:.1f} ± {t['std']:.1f}"


def _lat(d: dict[str, float]) -> str:
    return f"{d['p50']:.1f} / {d['p99']:.1f}" if d["n"] else "n/a"


def plot(rep: dict[str, Any], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = rep["levels"]
    xs = [r["concurrency"] for r in rows]
    sides = (("baseline", rep["baseline"]["tag"], "tab:gray"), ("patched", rep["patched"]["tag"], "tab:green"))
    paths = [out / name for name in PLOTS]

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for side, tag, color in sides:
        t = [r[side]["output_throughput"] for r in rows]
        ys = [v["mean"] for v in t]
        err = [[m - v["min"] for m, v in zip(ys, t, strict=True)], [v["max"] - m for m, v in zip(ys, t, strict=True)]]
        ax.errorbar(xs, ys, yerr=err, marker="o", capsize=4, label=tag, color=color)
    ax.set(xscale="log", xlabel="concurrent users", ylabel="output tokens / s", title="Throughput (min-max of repeats)")
    ax.set_xticks(xs, [str(x) for x in xs])
    ax.minorticks_off()
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(paths[0], dpi=120)
    plt.close(fig)

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    for ax, key, name in ((axes[0], "ttft_ms", "TTFT"), (axes[1], "tpot_ms", "TPOT")):
        for side, tag, color in sides:
            for pct, style in (("p50", "-"), ("p99", "--")):
                ax.plot(xs, [r[side][key][pct] for r in rows], style, marker="o", color=color, label=f"{tag} {pct}")
        ax.set(xscale="log", xlabel="concurrent users", ylabel="ms", title=f"{name} percentiles")
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.minorticks_off()
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(paths[1], dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    g = [r["gain_output_throughput"] for r in rows]
    ys = [v["mean"] for v in g]
    err = [[m - v["low"] for m, v in zip(ys, g, strict=True)], [v["high"] - m for m, v in zip(ys, g, strict=True)]]
    ax.errorbar(xs, ys, yerr=err, marker="o", capsize=4, color="tab:green")
    ax.axhline(1.0, color="gray", linestyle="--", linewidth=1)
    ax.set(xscale="log", xlabel="concurrent users", ylabel="patched / baseline",
           title="Output-throughput gain (worst-best pairing of repeats)")  # fmt: skip
    ax.set_xticks(xs, [str(x) for x in xs])
    ax.minorticks_off()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(paths[2], dpi=120)
    plt.close(fig)
    return paths


def stored_slo(base_dir: Path, patched_dir: Path, ttft_ms: float | None, tpot_ms: float | None) -> metrics.Slo:
    """The SLOs given, else those ``loadtest run`` stored with the two runs (ValueError when they differ)."""
    stored = []
    for folder in (base_dir, patched_dir):
        try:
            meta = json.loads((folder / metrics.RUN_FILE).read_text())
        except (OSError, ValueError):
            meta = {}
        stored.append(meta.get("slo") or {})
    bounds = {}
    for key, given in (("ttft_ms", ttft_ms), ("tpot_ms", tpot_ms)):
        if given is not None:
            bounds[key] = given
            continue
        values = {s.get(key) for s in stored}
        if len(values) > 1:
            flag = "--slo-" + key.replace("_", "-")
            raise ValueError(f"the runs were measured with different {key} SLOs {sorted(values, key=str)}: pass {flag}")
        bounds[key] = values.pop()
    return metrics.Slo(**bounds)


def compare(args: argparse.Namespace) -> int:
    base_dir, patched_dir = resolve(args.baseline), resolve(args.patched)
    rep = build(base_dir, patched_dir, stored_slo(base_dir, patched_dir, args.slo_ttft_ms, args.slo_tpot_ms))
    out = Path(args.out) if args.out else patched_dir.parent / f"compare_{base_dir.name}_vs_{patched_dir.name}"
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f"--out {out}: cannot make a folder there ({e.strerror})") from None
    text = markdown(rep)
    (out / "report.md").write_text(text)
    (out / "report.json").write_text(json.dumps(rep, indent=2, default=str) + "\n")
    plot(rep, out)
    print(text)
    print(f"compare: wrote {out / 'report.md'}, report.json and {', '.join(PLOTS)}")
    return 0
