"""Load tests for an SGLang server: Locust traffic, per-request records, summaries and A/B reports.

Data flow::

    workload.py   seeded prompts and request bodies; SSE chunk parsing (pure Python, no Locust)
    locustfile.py Locust user: one streamed request -> one JSON line (TTFT, every gap, tokens, status)
    runner.py     `loadtest run`: /health check, a Locust subprocess per (concurrency, repeat), results folder
    metrics.py    per-request JSONL -> throughput, goodput, latency percentiles (the only place figures come from)
    report.py     `loadtest compare`: refuses mismatched runs, writes report.md and PNG plots
    accuracy.py   `loadtest accuracy`: prompt logprobs (KL) and word problems (accuracy) against a reference
    corpus.py     the generated passages and problems, and readers for a user's corpus or GSM8K-style file
    accuracy_report.py / accuracy_stats.py   the accuracy records, their comparison and report text; the math

Nothing here imports Locust except locustfile.py, which only ever runs inside a Locust process
(`import locust` monkey-patches the standard library through gevent).
"""
