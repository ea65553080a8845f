"""Launch profiles: SGLang server flags as data (``configs/profiles/NAME.toml``), each with its reason.

A profile names the GPU it was written for, how many nodes and GPUs it spans, the default context, and
an ordered table of SGLang flags. ``plan`` checks that the weights and KV cache fit; ``serve`` turns the
profile into the SGLang command line. Imports nothing heavy.

File format::

    description = "one line"
    gpu = "rtx-pro-6000"        # a name in sglang_glm5.hardware.TARGETS
    gpu_memory_gib = 95.5       # memory CUDA reports per GPU
    gpus_per_node = 8
    context = 32768             # default --context of plan / serve

    [flags]                     # SGLang flag (without "--") = { value, reason }; true: a switch
    tp-size = { value = 8, reason = "..." }

    [env]                       # optional: environment serve exports unless the caller already set it
    NCCL_P2P_LEVEL = { value = "SYS", reason = "..." }

    [mtp]                       # optional: flags added by --mtp (multi-token prediction); a flag named in
    speculative-algorithm = { value = "NEXTN", reason = "..." }   # [flags] too is replaced by this value
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, replace
from importlib.resources import files
from pathlib import Path

from sglang_glm5.hardware import TARGETS

DEFAULT_PROFILE = "rtx-pro-6000x8-ep8"
_KEYS = {"description", "gpu", "gpu_memory_gib", "gpus_per_node", "context", "flags"}
_OPTIONAL_KEYS = {"env", "mtp"}
MTP_FLAG = "speculative-algorithm"  # a profile with this flag runs a draft model (NEXTN: the checkpoint's MTP layer)

FlagValue = bool | int | float | str


@dataclass(frozen=True)
class Flag:
    name: str  # SGLang's flag without the leading "--", e.g. "tp-size"
    value: FlagValue  # True: a switch given without a value
    reason: str

    def argv(self) -> list[str]:
        """The flag as command-line tokens; a false switch gives none."""
        if self.value is True:
            return [f"--{self.name}"]
        if self.value is False:
            return []
        return [f"--{self.name}", str(self.value)]


@dataclass(frozen=True)
class EnvVar:
    name: str  # e.g. NCCL_P2P_LEVEL
    value: str
    reason: str


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    gpu: str
    gpu_memory_gib: float
    gpus_per_node: int
    context: int
    flags: tuple[Flag, ...]
    env: tuple[EnvVar, ...] = ()
    mtp_flags: tuple[Flag, ...] = ()  # the [mtp] table: what --mtp adds

    @property
    def mtp(self) -> bool:
        """True when the profile runs a draft model (speculative decoding)."""
        return self.get(MTP_FLAG) not in (None, False)

    def with_mtp(self) -> Profile:
        """This profile with its [mtp] flags: a flag of both tables takes the [mtp] value, in the [flags] place."""
        if not self.mtp_flags:
            raise ValueError(f"profile {self.name} has no [mtp] table; --mtp needs one of {', '.join(mtp_profiles())}")
        if self.mtp:
            return self
        extra = {flag.name: flag for flag in self.mtp_flags}
        flags = [extra.pop(flag.name, flag) for flag in self.flags]
        return replace(self, description=f"{self.description}, MTP ({self.mtp_flags[0].value})",
                       flags=(*flags, *extra.values()))  # fmt: skip

    def get(self, name: str, default: FlagValue | None = None) -> FlagValue | None:
        for flag in self.flags:
            if flag.name == name:
                return flag.value
        return default

    @property
    def nnodes(self) -> int:
        return int(self.get("nnodes", 1))

    @property
    def num_gpus(self) -> int:
        return self.nnodes * self.gpus_per_node


def profile_names() -> list[str]:
    folder = files("sglang_glm5.configs") / "profiles"
    return sorted(p.name.removesuffix(".toml") for p in folder.iterdir() if p.name.endswith(".toml"))


def mtp_profiles() -> list[str]:
    """The shipped profiles with an [mtp] table."""
    return [name for name in profile_names() if load_profile(name).mtp_flags]


def is_profile_path(name: str) -> bool:
    """True when ``--profile`` names a file (a ``.toml`` name or one with a folder) rather than a shipped profile."""
    return name.endswith(".toml") or "/" in name or os.sep in name


def load_profile(name: str) -> Profile:
    """A shipped profile by name, or a profile file by path (``is_profile_path``), checked as the shipped ones are;
    ValueError naming the known ones when there is none."""
    if is_profile_path(name):
        try:
            text = Path(name).read_text()
        except OSError as e:
            raise ValueError(f"profile file {name}: cannot read it ({e.strerror or e})") from None
        return parse_profile(name, text)
    known = profile_names()
    if name not in known:
        raise ValueError(f"unknown profile {name!r}; expected one of {', '.join(known)}, or a path to a .toml file")
    text = (files("sglang_glm5.configs") / "profiles" / f"{name}.toml").read_text()
    return parse_profile(name, text)


def profile_help() -> str:
    """The help of every ``--profile`` option: the shipped names and the file alternative."""
    names = [f"{n} (default)" if n == DEFAULT_PROFILE else n for n in profile_names()]
    return (f"launch profile: {', '.join(names)}; or a path to a TOML file in their format "
            "(configs/profiles/*.toml, e.g. for 4 or 16 GPUs), checked as they are")  # fmt: skip


def parse_profile(name: str, text: str) -> Profile:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"profile {name}: not valid TOML ({e})") from None
    unknown = set(data) - _KEYS - _OPTIONAL_KEYS
    missing = _KEYS - set(data)
    if unknown or missing:
        raise ValueError(
            f"profile {name}: expected keys {sorted(_KEYS)} (optional {sorted(_OPTIONAL_KEYS)}), "
            f"missing {sorted(missing)}, unknown {sorted(unknown)}"
        )
    env = []
    for var, value, reason in _entries(name, "env", data.get("env", {})):
        if not var.isupper() or not isinstance(value, str):
            raise ValueError(f"profile {name}: env {var} must be an upper-case name with a string value, got {value!r}")
        env.append(EnvVar(var, value, reason))
    if data["gpu"] not in TARGETS:
        raise ValueError(f"profile {name}: gpu must be one of {', '.join(TARGETS)}, got {data['gpu']!r}")
    for key, kind in (("gpu_memory_gib", (int, float)), ("gpus_per_node", int), ("context", int)):
        if not isinstance(data[key], kind) or isinstance(data[key], bool) or not data[key] > 0:
            raise ValueError(f"profile {name}: {key} must be a positive number, got {data[key]!r}")
    mtp_flags = tuple(_flags(name, "mtp", data.get("mtp", {})))
    if mtp_flags and not any(flag.name == MTP_FLAG for flag in mtp_flags):
        raise ValueError(f"profile {name}: the [mtp] table must set {MTP_FLAG}")
    return Profile(
        name=name,
        description=str(data["description"]),
        gpu=str(data["gpu"]),
        gpu_memory_gib=float(data["gpu_memory_gib"]),
        gpus_per_node=int(data["gpus_per_node"]),
        context=int(data["context"]),
        flags=tuple(_flags(name, "flags", data["flags"])),
        env=tuple(env),
        mtp_flags=mtp_flags,
    )


def _entries(name: str, table: str, entries: dict) -> list[tuple[str, FlagValue, str]]:
    """(key, value, reason) of a table of ``key = { value = ..., reason = "..." }``."""
    out = []
    for key, entry in entries.items():
        if not isinstance(entry, dict) or set(entry) != {"value", "reason"} or not str(entry["reason"]).strip():
            raise ValueError(
                f'profile {name}: [{table}] {key} must be {{ value = ..., reason = "..." }}, got {entry!r}'
            )
        out.append((key, entry["value"], str(entry["reason"])))
    return out


def _flags(name: str, table: str, entries: dict) -> list[Flag]:
    flags = []
    for flag_name, value, reason in _entries(name, table, entries):
        if flag_name.startswith("-"):
            raise ValueError(f"profile {name}: write flag {flag_name} without the leading dashes")
        flags.append(Flag(flag_name, value, reason))
    return flags
