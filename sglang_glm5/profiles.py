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
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from importlib.resources import files

DEFAULT_PROFILE = "rtx-pro-6000x8-ep8"
_KEYS = {"description", "gpu", "gpu_memory_gib", "gpus_per_node", "context", "flags"}

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
class Profile:
    name: str
    description: str
    gpu: str
    gpu_memory_gib: float
    gpus_per_node: int
    context: int
    flags: tuple[Flag, ...]

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


def load_profile(name: str) -> Profile:
    """A shipped profile by name; ValueError naming the known ones when there is none."""
    known = profile_names()
    if name not in known:
        raise ValueError(f"unknown profile {name!r}; expected one of {', '.join(known)}")
    text = (files("sglang_glm5.configs") / "profiles" / f"{name}.toml").read_text()
    return parse_profile(name, text)


def parse_profile(name: str, text: str) -> Profile:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"profile {name}: not valid TOML ({e})") from None
    unknown = set(data) - _KEYS
    missing = _KEYS - set(data)
    if unknown or missing:
        raise ValueError(
            f"profile {name}: expected keys {sorted(_KEYS)}, missing {sorted(missing)}, unknown {sorted(unknown)}"
        )
    flags = []
    for flag_name, entry in data["flags"].items():
        if not isinstance(entry, dict) or set(entry) != {"value", "reason"} or not str(entry["reason"]).strip():
            raise ValueError(
                f'profile {name}: flag {flag_name} must be {{ value = ..., reason = "..." }}, got {entry!r}'
            )
        if flag_name.startswith("-"):
            raise ValueError(f"profile {name}: write flag {flag_name} without the leading dashes")
        flags.append(Flag(flag_name, entry["value"], entry["reason"]))
    return Profile(
        name=name,
        description=str(data["description"]),
        gpu=str(data["gpu"]),
        gpu_memory_gib=float(data["gpu_memory_gib"]),
        gpus_per_node=int(data["gpus_per_node"]),
        context=int(data["context"]),
        flags=tuple(flags),
    )
