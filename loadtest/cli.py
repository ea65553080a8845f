"""`sglang-glm5 loadtest run | accuracy | compare`.

Imports nothing heavy: Locust runs in a subprocess, matplotlib on use.
"""

from __future__ import annotations

import argparse

from sglang_glm5.cli import int_list, positive


def _cmd_run(args: argparse.Namespace) -> int:
    from sglang_glm5.cli import require
    from sglang_glm5.loadtest import runner

    require("locust", "loadtest run (Locust drives the load)", "loadtest")
    return runner.run(args)


def _cmd_accuracy(args: argparse.Namespace) -> int:
    from sglang_glm5.loadtest import accuracy

    return accuracy.run(args)


def _cmd_compare(args: argparse.Namespace) -> int:
    from sglang_glm5.cli import require
    from sglang_glm5.loadtest import report

    require("matplotlib", "loadtest compare (its plots)", "loadtest")
    return report.compare(args)


def add_cli(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "loadtest",
        help="Locust load test of an SGLang server, and the baseline-vs-patched report",
        description="`run` sweeps concurrency levels against a running server and writes a results folder; "
        "`compare` reports the throughput gain of one results folder over another.",
    )
    sub = p.add_subparsers(dest="loadtest_command", required=True)

    r = sub.add_parser(
        "run",
        help="sweep concurrency levels with Locust (headless) and write a results folder",
        description="Checks /health, then for each concurrency level and repeat runs Locust headless in a "
        "subprocess (closed loop, streamed requests) and writes OUT/TAG/: requests.jsonl (one record per "
        "request), summary.json, server_info.json, run.json, command.txt.",
    )
    r.add_argument("--host", required=True, help="server URL, e.g. http://127.0.0.1:30000")
    r.add_argument("--tag", required=True, help="name of this run (the results folder's name), e.g. baseline")
    r.add_argument("--out", default="loadtest_results", help="parent folder of results (loadtest_results)")
    r.add_argument("--concurrency", type=int_list, default=[1, 8, 32, 64, 128], help="users per level (1,8,32,64,128)")
    r.add_argument("--duration", type=positive(float), default=60.0, help="seconds per run (60)")
    r.add_argument("--repeats", type=positive(int), default=3, help="runs per level (3)")
    r.add_argument("--warmup", type=int, default=8, help="warm-up requests before the sweep (8)")
    r.add_argument("--flush-cache", action="store_true", help="POST /flush_cache before every run")
    r.add_argument("--mode", choices=("chat", "generate"), default="chat", help="/v1/chat/completions or /generate")
    r.add_argument("--input-len", type=positive(int), default=1024, help="prompt words, about a token each (1024)")
    r.add_argument("--output-len", type=positive(int), default=256, help="output tokens per request (256)")
    r.add_argument("--range-ratio", type=float, default=0.0, help="lengths uniform in [L*(1-r), L] (0: fixed)")
    r.add_argument("--seed", type=int, default=0, help="prompt seed (0)")
    r.add_argument("--prompt-file", default=None, help="JSONL prompts: {prompt|messages[, output_len]} per line")
    r.add_argument("--no-ignore-eos", action="store_true", help="let the model stop early (lengths then differ)")
    r.add_argument("--model", default=None, help="model name for requests (default: the server's /v1/models)")
    r.add_argument("--api-key", default=None, help="Bearer token (default: $SGLANG_GLM5_API_KEY)")
    r.add_argument(
        "--request-timeout", type=positive(float), default=600.0, help="seconds without data before a request fails"
    )
    r.add_argument("--slo-ttft-ms", type=positive(float), default=None, help="goodput SLO on TTFT (ms)")
    r.add_argument("--slo-tpot-ms", type=positive(float), default=None, help="goodput SLO on TPOT (ms)")
    r.add_argument("--overwrite", action="store_true", help="replace an existing results folder of the same tag")
    r.set_defaults(func=_cmd_run)

    from sglang_glm5.loadtest import accuracy  # stdlib only: the parser lives next to the command

    accuracy.add_cli(sub, _cmd_accuracy)

    c = sub.add_parser(
        "compare",
        help="report the gain of PATCHED over BASELINE (markdown + PNG plots)",
        description="Recomputes every figure from the two folders' requests.jsonl, refuses runs with different "
        "workloads or models, and writes report.md, report.json and PNG plots.",
    )
    c.add_argument("baseline", help="results folder of the stock server (or a tag under loadtest_results/)")
    c.add_argument("patched", help="results folder of the patched server (or a tag under loadtest_results/)")
    c.add_argument("--out", default=None, help="report folder (default: compare_BASELINE_vs_PATCHED next to PATCHED)")
    c.add_argument("--slo-ttft-ms", type=positive(float), help="goodput SLO on TTFT (ms; default: the runs')")
    c.add_argument("--slo-tpot-ms", type=positive(float), help="goodput SLO on TPOT (ms; default: the runs')")
    c.set_defaults(func=_cmd_compare)
