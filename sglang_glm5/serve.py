"""``sglang-glm5 serve``: SGLang's command line from a profile and its plan, then ``python -m sglang.launch_server``.

The command is built as a list of arguments (never a shell string), printed, and exec'd with the plugin's
environment. Extra SGLang arguments after ``--`` are checked against the profile:

- the process layout (tp, ep, nodes, pipeline / data parallel replicas) and the quantization are the
  profile's: a different value is an error naming the profile;
- the model path, host, port, node rank and rendezvous address belong to serve's own options;
- flags the plan reads (attn-dp, KV dtype, memory fraction, batch limits, MoE backend, context) replace
  the profile's value and the plan is redone with them, so an override that does not fit is refused;
- any other flag replaces the profile's value or is passed through;
- flags are spelled out: an abbreviation (``--tp`` for ``--tp-size``, which SGLang's argparse would accept)
  is refused, and with SGLang installed the final command is parsed by SGLang's own parser before anything
  starts, so an unknown or ambiguous flag, or a value SGLang refuses, fails here (``--dry-run`` too).

The ``SGLANG_GLM5_*`` switches are checked first (``sglang_glm5.env``): a bad value is refused before SGLang
starts, an unknown name is a note.
"""

from __future__ import annotations

import argparse
import difflib
import functools
import importlib.util
import os
import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

from sglang_glm5 import env as switches
from sglang_glm5._net import check_bind
from sglang_glm5._proc import python_command
from sglang_glm5.patches import guard
from sglang_glm5.plan import PlanError, format_plan, load_model_config, make_plan
from sglang_glm5.predict_report import dry_run_lines
from sglang_glm5.profiles import DEFAULT_PROFILE, Flag, Profile, load_profile

API_KEY_ENV = switches.API_KEY.name
PLUGIN_NAME = "sglang_glm5"  # the entry point's name in the sglang.srt.plugins group
LAUNCHER = ("-m", "sglang.launch_server")

# SGLang 0.5.23's other spellings of the flags serve looks at (ServerArgs' parser; tests check them).
ALIASES = {
    "model": "model-path",
    "tensor-parallel-size": "tp-size",
    "expert-parallel-size": "ep-size",
    "ep": "ep-size",
    "attention-data-parallel-size": "attn-dp-size",
    "data-parallel-size": "dp-size",
    "pipeline-parallel-size": "pp-size",
    "nccl-init-addr": "dist-init-addr",
}
# The process layout and the checkpoint format: fixed by the profile (default when the profile is silent).
LOCKED = {"tp-size": 1, "ep-size": 1, "nnodes": 1, "pp-size": 1, "dp-size": 1, "quantization": None}
SERVE_OPTIONS = {"model-path": "--model", "host": "--host", "port": "--port", "node-rank": "--node-rank",
                 "dist-init-addr": "--dist-init-addr"}  # fmt: skip
PLANNED = {"attn-dp-size", "kv-cache-dtype", "mem-fraction-static", "max-running-requests",
           "cuda-graph-max-bs-decode", "moe-runner-backend", "context-length", "enable-dp-lm-head",
           "speculative-algorithm", "speculative-num-steps", "speculative-eagle-topk"}  # fmt: skip
_HF_REPO = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


@dataclass
class Extra:
    """One extra SGLang argument after ``--``: the flag as typed, its canonical name and its value tokens."""

    tokens: list[str]
    name: str | None = None  # canonical flag name without dashes; None for a stray value
    values: list[str] = field(default_factory=list)

    @property
    def value(self) -> str | None:
        return self.values[0] if self.values else None


def parse_extras(tokens: list[str], known: set[str] | None = None) -> list[Extra]:
    """Group ``--flag value...`` / ``--flag=value`` tokens; values are the tokens up to the next ``--flag``.

    ``known``: every flag name (without dashes) the launcher accepts, when SGLang is installed; else the
    names serve knows of. A flag that is not one of them but abbreviates one is a ValueError (argparse would
    read ``--tp`` as ``--tp-size``); with SGLang's list, an unknown flag is one too."""
    names = known if known is not None else _names_serve_knows()
    extras: list[Extra] = []
    for token in tokens:
        if token.startswith("--") and len(token) > 2:
            flag, eq, value = token[2:].partition("=")
            _check_spelling(token, flag, names, complete=known is not None)
            extras.append(Extra([token], ALIASES.get(flag, flag), [value] if eq else []))
        elif extras and extras[-1].name is not None:
            extras[-1].tokens.append(token)
            extras[-1].values.append(token)
        else:
            extras.append(Extra([token]))
    return extras


def _names_serve_knows() -> set[str]:
    return {*ALIASES, *ALIASES.values(), *LOCKED, *SERVE_OPTIONS, *PLANNED, "api-key", "enable-dp-attention"}


def _check_spelling(token: str, flag: str, names: set[str], *, complete: bool) -> None:
    if flag in names:
        return
    longer = sorted(n for n in names if n.startswith(flag))
    if longer:
        what = (
            f"an abbreviation of --{longer[0]}"
            if len(longer) == 1
            else "ambiguous: " + ", ".join(f"--{n}" for n in longer[:6])
        )
        raise ValueError(f"{token} (after --) is {what}; spell SGLang flags out in full")
    if complete:
        close = difflib.get_close_matches(flag, names, n=1)
        hint = f"; did you mean --{close[0]}?" if close else ""
        raise ValueError(f"{token} (after --) is not a flag of SGLang's launcher{hint}")


def sglang_flag_names() -> set[str] | None:
    """Every flag name (without dashes) SGLang's launcher accepts; None when SGLang is not installed."""
    if importlib.util.find_spec("sglang") is None:
        return None
    return set(_sglang_flag_names())


@functools.cache
def _sglang_flag_names() -> frozenset[str]:
    actions = _sglang_parser()._actions
    return frozenset(opt[2:] for action in actions for opt in action.option_strings if opt.startswith("--"))


class _RaisingParser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse would print usage and exit 2; serve reports one line
        raise ValueError(message)


def _sglang_parser() -> argparse.ArgumentParser:
    """SGLang's own ``ServerArgs`` parser, as ``prepare_server_args`` builds it."""
    from sglang.srt.server_args import ServerArgs

    parser = _RaisingParser(prog="sglang.launch_server")
    ServerArgs.add_cli_args(parser)
    return parser


def check_with_sglang(argv: list[str], backend: str) -> None:
    """Parse SGLang's arguments with SGLang's own parser (plugin's backend choice registered for the
    call); ValueError with argparse's message when it refuses them."""
    from sglang.srt.arg_groups import choices

    from sglang_glm5.patches import backend as plugin_backend

    registered = guard.BACKEND_NAME in choices.MOE_RUNNER_BACKEND_CHOICES
    if backend == guard.BACKEND_NAME and not registered:
        plugin_backend.register()
    try:
        _sglang_parser().parse_args(argv)
    except ValueError as e:
        raise ValueError(f"SGLang's parser refuses the command: {e}") from None
    finally:
        if backend == guard.BACKEND_NAME and not registered:
            plugin_backend.unregister()


@dataclass
class Launch:
    argv: list[str]  # the whole command, argv[0] the Python interpreter
    env: dict[str, str]  # the environment to exec with
    env_changes: dict[str, str]  # what serve set in it
    notes: list[str]


def _same(a: object, b: object) -> bool:
    return str(a).strip().lower() == str(b).strip().lower()


def _check_extras(profile: Profile, extras: list[Extra], args: argparse.Namespace) -> None:
    layout = f"tp {profile.get('tp-size', 1)}, ep {profile.get('ep-size', 1)}, {profile.nnodes} node(s), " + (
        f"quantization {profile.get('quantization')}"
    )
    for extra in extras:
        shown = " ".join(extra.tokens)
        if extra.name is None:
            raise ValueError(f"{shown!r} after -- is not a --flag or its value")
        if extra.name in LOCKED:
            want = profile.get(extra.name, LOCKED[extra.name])
            if extra.value is None or not _same(extra.value, want):
                raise ValueError(
                    f"{shown} (after --) conflicts with profile {profile.name} ({layout}); "
                    f"the layout comes from the profile: choose another --profile"
                )
        elif extra.name == "enable-dp-attention":
            raise ValueError(f"{shown} (after --) is deprecated in SGLang 0.5.23; use --attn-dp-size N after --")
        elif extra.name in SERVE_OPTIONS:
            raise ValueError(f"{shown} (after --): give it to serve as {SERVE_OPTIONS[extra.name]}, before --")
        elif extra.name == "api-key" and not extra.value:
            raise ValueError(f"{shown} (after --): expected a key after it; an empty key would leave the server open")
        elif extra.name == "api-key" and args.api_key and extra.value != args.api_key:
            raise ValueError("--api-key given twice with different values (serve's and after --)")
        elif extra.name == "context-length" and args.context is not None and extra.value != str(args.context):
            raise ValueError(f"{shown} (after --) and --context {args.context}: give the context once")
    if args.api_key is not None and not args.api_key:
        raise ValueError("--api-key: expected a key, got an empty one (which would leave the server open)")


def _check_model(path: str) -> tuple[str | None, list[str]]:
    """The config.json to plan with (None: the shipped GLM-5 one) and notes; ValueError for a missing path."""
    p = Path(path).expanduser()
    if p.exists():
        if not (p / "config.json").is_file():
            raise ValueError(f"--model {path}: no config.json in it (expected a Hugging Face model folder)")
        return str(p / "config.json"), []
    if _HF_REPO.match(path) and not path.startswith((".", "~")):
        return None, [f"--model {path} is not a local folder: SGLang will fetch it as a Hugging Face repo id"]
    raise ValueError(f"--model {path}: no such folder")


def _environment(backend: str, profile: Profile) -> tuple[dict[str, str], dict[str, str]]:
    env = dict(os.environ)
    changes: dict[str, str] = {}
    if backend == guard.BACKEND_NAME:
        if guard.disabled():
            raise ValueError(
                f"{guard.DISABLE_ENV} is set, which turns the plugin off, but the MoE backend is {backend}: unset "
                f"it, or run the stock backend with -- --moe-runner-backend flashinfer_cutlass"
            )
        allowed = env.get("SGLANG_PLUGINS", "")
        if allowed and PLUGIN_NAME not in {x.strip() for x in allowed.split(",")}:
            changes["SGLANG_PLUGINS"] = f"{allowed},{PLUGIN_NAME}"  # the whitelist must name our plugin
    for var in profile.env:  # the profile's [env] (NCCL on PCIe): the caller's own value wins
        if var.name not in env:
            changes[var.name] = var.value
    env.update(changes)
    return env, changes


def build(args: argparse.Namespace) -> tuple[Launch, object]:
    """The SGLang command and environment for ``args`` (serve's options), and the plan behind them."""
    errors, _ = switches.problems()
    if errors:  # before anything else: what the plugin would stop at in every worker
        raise ValueError("; ".join(errors))
    profile = load_profile(args.profile)
    if getattr(args, "mtp", False):
        profile = profile.with_mtp()
    config_path, notes = _check_model(args.model)  # before SGLang's import (seconds): a wrong path is told at once
    model, model_name = load_model_config(config_path)
    sglang_flags = sglang_flag_names()
    extras = parse_extras(list(args.extra), sglang_flags)
    _check_extras(profile, extras, args)
    nnodes = args.nnodes if args.nnodes is not None else profile.nnodes
    if nnodes != profile.nnodes:
        raise ValueError(f"--nnodes {nnodes}: profile {profile.name} runs on {profile.nnodes} node(s)")
    if nnodes > 1 and (args.node_rank is None or not args.dist_init_addr):
        raise ValueError(
            f"profile {profile.name} runs on {nnodes} nodes: pass --node-rank 0..{nnodes - 1} and "
            f"--dist-init-addr HOST:PORT (node 0's address, the same on every node)"
        )
    if nnodes == 1 and args.dist_init_addr:
        raise ValueError(f"--dist-init-addr: profile {profile.name} runs on one node (no rendezvous to join)")
    node_rank = args.node_rank or 0
    if not 0 <= node_rank < nnodes:
        raise ValueError(f"--node-rank {node_rank}: expected 0..{nnodes - 1} for {nnodes} node(s)")
    planned = {e.name: (e.value if e.value is not None else "true") for e in extras if e.name in PLANNED}
    context = args.context
    if "context-length" in planned:
        context = int(planned["context-length"]) if planned["context-length"].isdigit() else None
        if context is None:
            raise ValueError(f"--context-length {planned['context-length']}: expected a number of tokens")
    plan = make_plan(profile, model, model_name=model_name, context=context, overrides=planned)
    api_key = (
        args.api_key or next((e.value for e in extras if e.name == "api-key"), None) or switches.get(switches.API_KEY)
    )
    if node_rank == 0:
        check_bind(args.host, args.port)
        if args.host not in ("127.0.0.1", "localhost", "::1") and not api_key:
            notes.append(f"binding {args.host} without --api-key: anyone who can reach it can use the server")

    overridden = {e.name for e in extras if e.name is not None}
    derived = plan.values()
    flags: list[str] = ["--model-path", args.model, "--host", args.host, "--port", str(args.port)]
    for flag in profile.flags:
        if flag.name in overridden:
            continue
        flags += Flag(flag.name, derived.pop(flag.name, flag.value), flag.reason).argv()
    for name, value in derived.items():
        if name not in overridden:
            flags += [f"--{name}", str(value)]
    if nnodes > 1:
        flags += ["--node-rank", str(node_rank), "--dist-init-addr", args.dist_init_addr]
    if api_key:
        flags += ["--api-key", api_key]
    for extra in extras:
        if extra.name != "api-key":
            flags += extra.tokens
    backend = str(planned.get("moe-runner-backend", profile.get("moe-runner-backend", "auto")))
    environ, changes = _environment(backend, profile)
    notes += switches.problems(environ)[1]
    if sglang_flags is None:
        notes.append("SGLang is not installed here: the flags were not checked against its parser")
    else:
        check_with_sglang(flags, backend)
    return Launch(python_command(*LAUNCHER, *flags), environ, changes, notes), plan


def shown_command(launch: Launch) -> str:
    """The command for display: shell-quoted, with the API key hidden."""
    argv = ["python", *launch.argv[1:]]
    for i, token in enumerate(argv[:-1]):
        if token == "--api-key":
            argv[i + 1] = "<redacted>"
    prefix = [f"{k}={v}" for k, v in launch.env_changes.items()]
    return shlex.join([*prefix, *argv])


def add_cli(subparsers) -> None:
    from sglang_glm5.cli import port_number, positive
    from sglang_glm5.profiles import profile_help

    p = subparsers.add_parser(
        "serve",
        help="start SGLang with a launch profile (--dry-run: print the command)",
        description="Builds SGLang's command from a launch profile (configs/profiles/) and the memory plan, prints "
        "it, and execs python -m sglang.launch_server. Extra SGLang arguments go after --; the process layout "
        "and quantization stay the profile's.",
    )
    p.add_argument("--model", required=True, help="model folder (with config.json) or a Hugging Face repo id")
    p.add_argument("--profile", default=DEFAULT_PROFILE, help=profile_help())
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=port_number, default=30000, help="HTTP port (default 30000)")
    p.add_argument("--api-key", default=None, help=f"required from clients (default: ${API_KEY_ENV} if set)")

    p.add_argument(
        "--context", type=positive(int), default=None, help="longest request in tokens (default: the profile's)"
    )
    p.add_argument("--nnodes", type=int, default=None, help="nodes (multi-node profiles; default: the profile's)")
    p.add_argument("--node-rank", type=int, default=None, help="this node's rank, 0 on the node that serves HTTP")
    p.add_argument("--dist-init-addr", default=None, help="node 0's HOST:PORT for the multi-node rendezvous")
    p.add_argument("--mtp", action="store_true", help="multi-token prediction: the profile's [mtp] flags (NEXTN)")
    p.add_argument("--dry-run", action="store_true", help="print the plan and the command, start nothing")
    p.add_argument("extra", nargs="*", help="extra SGLang arguments, after --")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        launch, plan = build(args)
    except PlanError as e:
        raise ValueError(str(e)) from None
    print(format_plan(plan), file=sys.stderr)
    for note in launch.notes:
        print(f"serve: note: {note}", file=sys.stderr)
    if args.dry_run:
        print(dry_run_lines(plan), file=sys.stderr)
    print(shown_command(launch), flush=True)
    if args.dry_run:
        return 0
    if importlib.util.find_spec("sglang") is None:
        raise ValueError("SGLang is not installed in this Python: pip install 'sglang-glm5[sglang]'")
    sys.stderr.flush()
    os.execvpe(launch.argv[0], launch.argv, launch.env)
    return 0  # not reached
