"""``sglang-glm5 router``: SGLang's router in front of N SGLang servers (replicas of a launch profile).

The router is SGLang's Model Gateway, PyPI ``smg`` (``pip install 'sglang-glm5[router]'``), the successor of the
``sglang-router`` package: ``python -m smg.launch_router``. It keeps one radix tree of the prompts each worker has
seen and sends a request to the worker that holds its longest prefix (``--policy cache_aware``) unless the workers'
loads drift apart, checks the workers' health, retries a request that could not reach a worker on another one,
and answers SGLang's and OpenAI's HTTP API itself, so clients (and ``sglang-glm5 loadtest run``) talk to it as to
one server.

The command is built as a list of arguments, printed, and exec'd. The router and its Prometheus metrics bind the
same host (127.0.0.1 unless told otherwise; smg's own default for the metrics is every interface). Extra ``smg``
arguments go after ``--``. Imports nothing heavy.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shlex
import sys
from dataclasses import dataclass
from urllib.parse import urlsplit

from sglang_glm5._net import check_bind

ROUTER_MODULE = "smg.launch_router"  # SGLang Model Gateway 1.13 (PyPI smg); sglang-router 0.3's was sglang_router.*
ROUTER_DIST = "smg"
POLICIES = ("cache_aware", "round_robin", "power_of_two", "least_load", "random", "prefix_hash", "consistent_hashing")
DEFAULT_PORT = 8000  # the router's own port; every worker keeps SGLang's 30000 on its own machine


@dataclass
class RouterLaunch:
    argv: list[str]  # the whole command, argv[0] the Python interpreter
    notes: list[str]


def check_worker_urls(urls: list[str]) -> list[str]:
    """Each URL as ``http(s)://host:port`` without a trailing slash; ValueError naming a bad or repeated one."""
    if not urls:
        raise ValueError("--worker-urls: expected at least one SGLang server URL, e.g. http://10.0.0.1:30000")
    seen: list[str] = []
    for url in urls:
        parts = urlsplit(url)
        try:
            port = parts.port
        except ValueError:
            port = None
        if parts.scheme not in ("http", "https") or not parts.hostname or port is None or parts.path not in ("", "/"):
            raise ValueError(f"--worker-urls {url}: expected http://HOST:PORT (an SGLang server), got {url!r}")
        clean = f"{parts.scheme}://{parts.netloc}"
        if clean in seen:
            raise ValueError(f"--worker-urls {url}: given twice; each replica once")
        seen.append(clean)
    return seen


def build(args: argparse.Namespace) -> RouterLaunch:
    workers = check_worker_urls(list(args.worker_urls))
    if args.metrics_port == args.port:
        raise ValueError(f"--metrics-port {args.metrics_port} is the router's --port; choose another")
    check_bind(args.host, args.port, "--port")
    check_bind(args.host, args.metrics_port, "--metrics-port")
    notes = []
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        notes.append(
            f"binding {args.host}: the router answers anyone who can reach it (smg's own auth flags go after --)"
        )
    if len(workers) == 1:
        notes.append("one worker: the router adds health checks and retries, not capacity")
    argv = [
        sys.executable, "-m", ROUTER_MODULE,
        "--host", args.host, "--port", str(args.port),
        "--worker-urls", *workers,
        "--policy", args.policy,
        "--prometheus-host", args.host, "--prometheus-port", str(args.metrics_port),
        # Routing by text needs no tokenizer; without this the router fetches the workers' tokenizer from their
        # model path or Hugging Face (a path on another machine, or no network on a GPU box).
        "--disable-tokenizer-autoload",
    ]  # fmt: skip
    if args.api_key:
        argv += ["--api-key", args.api_key]  # smg sends it to the workers (SGLang started with --api-key)
    argv += list(args.extra)
    return RouterLaunch(argv, notes)


def shown_command(launch: RouterLaunch) -> str:
    argv = ["python", *launch.argv[1:]]
    for i, token in enumerate(argv[:-1]):
        if token == "--api-key":
            argv[i + 1] = "<redacted>"
    return shlex.join(argv)


def add_cli(subparsers) -> None:
    from sglang_glm5.cli import port_number

    p = subparsers.add_parser(
        "router",
        help="SGLang's router (smg) in front of SGLang servers, cache-aware (--dry-run: print the command)",
        description="Starts SGLang's Model Gateway (PyPI smg, python -m smg.launch_router) in front of the given "
        "SGLang servers, e.g. replicas started with `sglang-glm5 serve` on several machines. Clients and "
        "`sglang-glm5 loadtest run --host` use the router's URL as one server's. Extra smg arguments go after --.",
    )
    p.add_argument(
        "--worker-urls", nargs="+", required=True, metavar="URL", help="the SGLang servers: http://HOST:PORT"
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument(
        "--port", type=port_number, default=DEFAULT_PORT, help=f"the router's HTTP port (default {DEFAULT_PORT})"
    )
    p.add_argument("--metrics-port", type=port_number, default=29000, help="Prometheus metrics port (default 29000)")
    p.add_argument("--policy", choices=POLICIES, default="cache_aware",
                   help="cache_aware (default): the worker holding the longest prefix of the prompt, unless loads "
                   "drift apart; round_robin, power_of_two, ... as smg documents them")  # fmt: skip
    p.add_argument("--api-key", default=None, help="the workers' --api-key, sent by the router to them")
    p.add_argument("--dry-run", action="store_true", help="print the command, start nothing")
    p.add_argument("extra", nargs="*", help="extra smg arguments, after --")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    launch = build(args)
    for note in launch.notes:
        print(f"router: note: {note}", file=sys.stderr)
    print(shown_command(launch), flush=True)
    if args.dry_run:
        return 0
    if importlib.util.find_spec(ROUTER_DIST) is None:
        raise ValueError(
            f"the router is not installed in this Python: pip install 'sglang-glm5[router]' ({ROUTER_DIST})"
        )
    sys.stderr.flush()
    os.execvp(launch.argv[0], launch.argv)
    return 0  # not reached
