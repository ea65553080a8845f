"""The workload: seeded prompts with fixed length distributions, and the request bodies sent for them.

Request i of a run is a pure function of (seed, i): the baseline and the patched server see the same
prompts in the same order. Lengths are drawn uniformly from [L * (1 - range_ratio), L] (range_ratio 0:
every request has exactly L), as `sglang.bench_serving --random-range-ratio` does. Input length is
counted in words drawn from a list of common English words, about one token each; the true token
count comes back in the server's `usage`. `ignore_eos` and `min_tokens` make both servers produce
exactly the requested number of output tokens, so their throughputs compare like for like.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MODES = ("chat", "generate")  # /v1/chat/completions (OpenAI API) or SGLang's native /generate

# Common words that are one token each in most BPE vocabularies (GLM's included).
_WORDS = (
    "the of and to in is that for it as was with be by on not he this are or his from at which but have an "
    "they you were her she there one all we their can has been if more when will would who so no time out "
    "up about into than them only other new some could these two may first then do any like my now over "
    "such our man me even most made after also did many before must through back years where much your way "
    "well down should because each just those people how too little state good very make world still own "
    "see men work long get here between both life being under never day same another know while last might "
    "us great old year off come since against go came right used take three place small found part water "
    "light house side both hand high case point group number system city order music river table garden"
).split()


@dataclass(frozen=True)
class Workload:
    """Everything that decides what is sent. Two runs compare only when their workloads are equal."""

    mode: str = "chat"
    input_len: int = 1024  # words per prompt (about one token each)
    output_len: int = 256  # output tokens per request
    range_ratio: float = 0.0  # lengths uniform in [L * (1 - r), L]
    seed: int = 0
    prompt_file: str | None = None  # JSONL: {"prompt": str} or {"messages": [...]}, optional "output_len"
    prompt_file_sha256: str | None = None
    ignore_eos: bool = True

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.input_len < 1 or self.output_len < 1:
            raise ValueError(f"input_len and output_len must be >= 1, got {self.input_len}, {self.output_len}")
        if not 0.0 <= self.range_ratio < 1.0:
            raise ValueError(f"range_ratio must be in [0, 1), got {self.range_ratio}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Workload:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

    def with_prompt_file(self, path: str | None) -> Workload:
        """The same workload reading prompts from `path`, with the file's hash (the comparison key)."""
        if path is None:
            return dataclasses.replace(self, prompt_file=None, prompt_file_sha256=None)
        try:
            data = Path(path).read_bytes()
        except OSError as e:
            raise ValueError(f"--prompt-file {path}: cannot read it ({e.strerror})") from None
        _parse_prompt_file(Path(path), data)  # every line checked before anything is sent or written
        digest = hashlib.sha256(data).hexdigest()
        return dataclasses.replace(self, prompt_file=str(path), prompt_file_sha256=digest)

    def comparable_dict(self) -> dict[str, Any]:
        """What must match between two runs: the file's content counts, not where it lies."""
        d = self.to_dict()
        d.pop("prompt_file")
        return d


@dataclass(frozen=True)
class RequestSpec:
    index: int
    messages: list[dict[str, str]]  # chat mode
    prompt: str  # generate mode (the user message text when the file gave messages)
    output_len: int


class PromptSource:
    """Request i -> RequestSpec, deterministic in (workload.seed, salt, i)."""

    def __init__(self, workload: Workload, salt: str = "") -> None:
        self.workload = workload
        self.salt = salt
        self._file_rows: list[dict[str, Any]] | None = None
        if workload.prompt_file:
            self._file_rows = _read_prompt_file(Path(workload.prompt_file))

    def _length(self, rng: random.Random, length: int) -> int:
        low = max(1, round(length * (1.0 - self.workload.range_ratio)))
        return rng.randint(low, length)

    def get(self, i: int) -> RequestSpec:
        w = self.workload
        rng = random.Random(f"{w.seed}:{self.salt}:{i}")
        if self._file_rows is not None:
            row = self._file_rows[i % len(self._file_rows)]
            messages = row.get("messages") or [{"role": "user", "content": row["prompt"]}]
            prompt = row.get("prompt") or "\n".join(m["content"] for m in messages)
            out = int(row.get("output_len") or self._length(rng, w.output_len))
            return RequestSpec(i, messages, prompt, out)
        n_in = self._length(rng, w.input_len)
        prompt = " ".join(rng.choice(_WORDS) for _ in range(n_in))
        return RequestSpec(i, [{"role": "user", "content": prompt}], prompt, self._length(rng, w.output_len))


def _read_prompt_file(path: Path) -> list[dict[str, Any]]:
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ValueError(f"{path}: cannot read it ({e.strerror})") from None
    return _parse_prompt_file(path, data)


def _parse_prompt_file(path: Path, data: bytes) -> list[dict[str, Any]]:
    """The rows of a prompt file's content ``data`` (JSONL); ValueError naming ``path`` and the line."""
    try:
        lines = data.decode("utf-8-sig").splitlines()  # a byte-order mark some editors write
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: cannot read it as text ({e})") from None
    rows = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{n}: not JSON ({e.msg}); expected one JSON object a line") from None
        if not isinstance(row, dict) or not ("prompt" in row or "messages" in row):
            raise ValueError(f"{path}:{n}: expected a JSON object with 'prompt' or 'messages', got {line[:80]!r}")
        rows.append(row)
    if not rows:
        raise ValueError(f"{path}: no prompts")
    return rows


def chat_body(spec: RequestSpec, model: str, ignore_eos: bool = True, stream: bool = True) -> dict[str, Any]:
    """An OpenAI chat-completions body with SGLang's extra sampling fields."""
    body: dict[str, Any] = {
        "model": model,
        "messages": spec.messages,
        "max_tokens": spec.output_len,
        "temperature": 0.0,
        "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    if ignore_eos:
        body["ignore_eos"] = True
        body["min_tokens"] = spec.output_len
    return body


def generate_body(spec: RequestSpec, ignore_eos: bool = True, stream: bool = True) -> dict[str, Any]:
    """A body for SGLang's native /generate."""
    sampling: dict[str, Any] = {"max_new_tokens": spec.output_len, "temperature": 0.0}
    if ignore_eos:
        sampling["ignore_eos"] = True
        sampling["min_new_tokens"] = spec.output_len
    return {"text": spec.prompt, "sampling_params": sampling, "stream": stream}


def request_for(workload: Workload, spec: RequestSpec, model: str, stream: bool = True) -> tuple[str, dict[str, Any]]:
    """(path, body) for one request of this workload."""
    if workload.mode == "chat":
        return "/v1/chat/completions", chat_body(spec, model, workload.ignore_eos, stream)
    return "/generate", generate_body(spec, workload.ignore_eos, stream)
