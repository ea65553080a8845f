"""The ``SGLANG_GLM5_*`` environment switches: one typed registry (name, type, default, what it does).

Every module reads its switch through ``get``: one parser per type, one error format
(``NAME: expected ..., got '...'``), and a parse done once per distinct value (the hot path pays a
dictionary lookup). ``problems`` checks the whole environment at once, for the places a user meets
first: ``sglang-glm5 serve`` before it starts SGLang, ``doctor``, and the SGLang plugin when it loads.
The README's table of switches is ``markdown_table()`` (a test keeps the two equal;
``python -m sglang_glm5.env`` prints it). Imports nothing heavy.
"""

from __future__ import annotations

import difflib
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

# The op's path names, one vocabulary for the op (``moe.fused_moe(path=)``), the kernel families (``variants.NAMES``),
# the plugin's switch (``MOE_PATH``), ``w4a4_select.resolve_path`` and the CLI's ``--path``; each takes those that it
# serves. "auto" picks among the families by GPU and size.
AUTO = "auto"
PATHS = (AUTO, "w4a16", "w4a4", "dense")
PREFIX = "SGLANG_GLM5_"
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")


class EnvError(ValueError):
    """A switch set to a value its type refuses; the message names the variable."""


def parse_bool(name: str, text: str) -> bool:
    """1/true/yes/on or 0/false/no/off (any case; empty = off)."""
    value = text.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise EnvError(f"{name}: expected one of {', '.join(_TRUE)} (on) or {', '.join(_FALSE[1:])} (off), got {text!r}")


def parse_tokens(name: str, text: str, *, allow_inf: bool) -> float | None:
    """A number of tokens per expert >= 0 (infinity only where ``allow_inf``); None when empty."""
    text = text.strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not value >= 0 or (math.isinf(value) and not allow_inf):  # not >= 0 also rejects nan
        raise EnvError(f"{name}: expected a number of tokens per expert >= 0, got {text!r}")
    return value


def _choice(*choices: str) -> Callable[[str, str], str | None]:
    def parse(name: str, text: str) -> str | None:
        value = text.strip().lower()
        if not value:
            return None
        if value not in choices:
            raise EnvError(f"{name}: expected one of {', '.join(choices)}, got {text!r}")
        return value

    return parse


def _text(name: str, text: str) -> str | None:
    return text.strip() or None


@dataclass(frozen=True)
class Switch:
    name: str
    type: str  # as the README shows it
    default: object  # the value when unset or empty
    doc: str  # one line: what it does, and when it is read
    parse: Callable[[str, str], object]  # (name, raw text) -> value, None for "use the default"; EnvError
    secret: bool = False  # never printed

    def value(self, environ: Mapping[str, str] | None = None) -> object:
        raw = (os.environ if environ is None else environ).get(self.name, "")
        return _parsed(self, raw)


def _parsed(switch: Switch, raw: str) -> object:
    key = (switch.name, raw)
    if key not in _memo:  # unset or empty: the default (a switch that defaults to on stays on)
        value = switch.parse(switch.name, raw) if raw.strip() else None
        _memo[key] = switch.default if value is None else value
    return _memo[key]


_memo: dict[tuple[str, str], object] = {}

DISABLE = Switch(
    "SGLANG_GLM5_DISABLE", "bool", False,
    "turns the SGLang plugin off: a stock server even with the package installed; `serve` then refuses "
    "`--moe-runner-backend nvfp4_triton`",
    parse_bool,
)  # fmt: skip
CACHE_DIR = Switch(
    "SGLANG_GLM5_CACHE_DIR", "path", "~/.cache/sglang_glm5",
    "the user cache: autotune results (`autotune/TARGET.json`, read before the shipped ones), memoized AOT "
    "compiles (`aot_shared.json`)",
    _text,
)  # fmt: skip
SERVED_PATHS = tuple(p for p in PATHS if p != "dense")  # the paths the plugin may ask the op for
MOE_PATH = Switch(
    "SGLANG_GLM5_MOE_PATH", " \\| ".join(SERVED_PATHS), "auto",
    "the path the SGLang plugin asks the op for: `auto` takes W4A4 only on an SM12x GPU where `tune --path w4a4` "
    "passed its check against float64, from the threshold it measured, and dense prefill on sm_90 / sm_100 from "
    "`SGLANG_GLM5_DENSE_PREFILL_MIN_TOKENS`; `w4a16` the W4A16 kernels only; `w4a4` forces W4A4 (SM12x only, "
    "checked when weights load)",
    _choice(*SERVED_PATHS),
)  # fmt: skip
DENSE_PREFILL_MIN_TOKENS = Switch(
    "SGLANG_GLM5_DENSE_PREFILL_MIN_TOKENS", "tokens per expert (>= 0, `inf` allowed)", 384.0,
    "from this many tokens per expert the op, on sm_90 / sm_100, dequantizes the layer to bf16 and runs grouped "
    "GEMMs (default from the H200 bench: between the sizes where each path measured faster; 0 = always, `inf` = never)",
    lambda name, text: parse_tokens(name, text, allow_inf=True),
)  # fmt: skip
W4A4_MIN_TOKENS = Switch(
    "SGLANG_GLM5_W4A4_MIN_TOKENS", "tokens per expert (>= 0, finite)", None,
    "from this many tokens per expert `auto` picks W4A4 where a passing `tune --path w4a4` stored a threshold "
    "(unset: that measured threshold)",
    lambda name, text: parse_tokens(name, text, allow_inf=False),
)  # fmt: skip
PDL = Switch(
    "SGLANG_GLM5_PDL", "bool", True,
    "below one token per expert the W4A16 op's launches (routing, gemm1, gemm2, top-k sum) use programmatic "
    "dependent launch on sm_90+: "
    "each starts while the one before it runs and waits for it on the GPU (where gemm2 walks several N tiles a "
    "program, each gemm2 program waits for its routing block's part of gemm1 first, for the rest at its end); "
    "from one to eight tokens per expert too, where gemm2's programs fill gemm1's last wave, each waiting for its "
    "block's part; off = plain stream order",
    parse_bool,
)  # fmt: skip
TWO_CHAINS = Switch(
    "SGLANG_GLM5_TWO_CHAINS", "bool", True,
    "from 1/8 to 1/2 token per expert (GLM-5 B = 4-16) the W4A16 op runs as two chains, one per half of the local "
    "experts (up to 1/4 token per expert, B = 4-8: each every other active expert), on two CUDA streams, each on "
    "half the SMs (the second forked after the first's routing launch, each chain's gemm1 and gemm2 beside the "
    "other's; one top-k sum), where gemm2 walks one N tile a program (GLM-5 EP8, not TP8), with one chain's K "
    "splits (its bits); an eager call runs them on its shape's first call only, one chain after that; off = one chain",
    parse_bool,
)  # fmt: skip
GLUON_GEMM1 = Switch(
    "SGLANG_GLM5_GLUON_GEMM1", "bool", True,
    "on sm_90 (H100 / H200) a W4A16 GEMM config marked Gluon (`-gl` in the cache, chosen by the tuner at decode "
    "and chunked-prefill sizes; `-ws` for gemm1 with a producer warp group) runs as the Gluon kernel "
    "(`variants/w4a16_gluon.py`); off = the Triton kernel with the same tile and split",
    parse_bool,
)  # fmt: skip
STOCK_CONFIGS = Switch(
    "SGLANG_GLM5_STOCK_CONFIGS", "bool", False,
    "on SM12x the plugin points `SGLANG_MOE_CONFIG_DIR` (when unset) at the shipped SM120 configs for SGLang's "
    "stock Triton MoE kernel; off by default because it hides SGLang's own config folder",
    parse_bool,
)  # fmt: skip
API_KEY = Switch(
    "SGLANG_GLM5_API_KEY", "text", None,
    "`serve`'s default `--api-key`, and the Bearer token of the load tests and examples; never printed",
    _text, secret=True,
)  # fmt: skip
TEST_DEVICE = Switch(
    "SGLANG_GLM5_TEST_DEVICE", "`cpu` \\| `cuda[:N]`", "cpu",
    "tests: `cpu` (kernels through the Triton interpreter) or a CUDA device (real compilation)",
    lambda name, text: _device(name, text),
)  # fmt: skip
SEED = Switch(
    "SGLANG_GLM5_SEED", "integer", None,
    "tests: replay the seed a failing test printed (default: a fresh seed per test)",
    lambda name, text: _integer(name, text),
)  # fmt: skip


def _device(name: str, text: str) -> str | None:
    value = text.strip().lower()
    if value and value != "cpu" and not (value == "cuda" or (value.startswith("cuda:") and value[5:].isdigit())):
        raise EnvError(f"{name}: expected cpu, cuda or cuda:N, got {text!r}")
    return value or None


def _integer(name: str, text: str) -> int | None:
    if not text.strip():
        return None
    try:
        return int(text)
    except ValueError:
        raise EnvError(f"{name}: expected an integer, got {text!r}") from None


SWITCHES: tuple[Switch, ...] = (
    DISABLE, CACHE_DIR, MOE_PATH, DENSE_PREFILL_MIN_TOKENS, W4A4_MIN_TOKENS, PDL, TWO_CHAINS, GLUON_GEMM1,
    STOCK_CONFIGS, API_KEY, TEST_DEVICE, SEED,
)  # fmt: skip
BY_NAME = {s.name: s for s in SWITCHES}


def get(switch: Switch | str, environ: Mapping[str, str] | None = None):
    """The switch's value (its default when unset or empty); EnvError on a value its type refuses."""
    return (BY_NAME[switch] if isinstance(switch, str) else switch).value(environ)


def cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    """$SGLANG_GLM5_CACHE_DIR, default ~/.cache/sglang_glm5."""
    return Path(str(get(CACHE_DIR, environ))).expanduser()


def problems(environ: Mapping[str, str] | None = None) -> tuple[list[str], list[str]]:
    """(errors, warnings) for the whole environment: a switch its type refuses is an error; a
    ``SGLANG_GLM5_*`` name that is no switch (a typo) is a warning naming the closest one."""
    environ = os.environ if environ is None else environ
    errors, warnings = [], []
    for name in sorted(n for n in environ if n.startswith(PREFIX)):
        switch = BY_NAME.get(name)
        if switch is None:
            close = difflib.get_close_matches(name, BY_NAME, n=1)
            hint = f"; did you mean {close[0]}?" if close else f"; known: {', '.join(BY_NAME)}"
            warnings.append(f"{name} is not a sglang-glm5 switch, ignored{hint}")
            continue
        try:
            switch.value(environ)
        except EnvError as e:
            errors.append(str(e))
    return errors, warnings


def markdown_table() -> str:
    """The README's table of switches."""
    rows = ["| variable | type | default | effect |", "|---|---|---|---|"]
    for s in SWITCHES:
        default = "unset" if s.default is None else f"`{_shown(s.default)}`"
        rows.append(f"| `{s.name}` | {s.type} | {default} | {s.doc} |")
    return "\n".join(rows)


def _shown(value: object) -> str:
    if isinstance(value, bool):
        return "0" if not value else "1"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


if __name__ == "__main__":
    print(markdown_table())
