"""One streamed response -> one measurement record. Pure Python: the locustfile feeds it lines and times.

Conventions of sglang.bench_serving and `vllm bench serve`:
- TTFT: request sent -> first chunk carrying output (`content` or `reasoning_content`; native mode:
  the first chunk whose completion_tokens or text grew).
- ITL: every gap between consecutive output chunks (all of them are kept in the record).
- TPOT: (E2E - TTFT) / (output_tokens - 1).
- Output and input tokens from `usage` (chat, `stream_options.include_usage`) or `meta_info`
  (native); when the server sends neither, output tokens are the output chunks counted.
A request succeeds only when the stream ends with `data: [DONE]` and produced output.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any


class StreamError(Exception):
    """The stream broke the protocol; the message is the failure reason recorded for the request."""


@dataclass
class StreamMeter:
    mode: str  # "chat" or "generate"
    start: float  # clock reading when the request was sent (seconds, any monotonic clock)
    chunk_times: list[float] = field(default_factory=list)  # arrival of each chunk that carried output
    usage_output: int | None = None
    usage_input: int | None = None
    done: bool = False
    bytes_read: int = 0

    def feed_line(self, line: bytes, now: float) -> None:
        """One line of the SSE body, read at clock `now`. Raises StreamError on a malformed chunk."""
        self.bytes_read += len(line)
        line = line.strip()
        if not line or line.startswith(b":") or not line.startswith(b"data:"):
            return  # blank separator, SSE comment/keep-alive, or a field we do not use (event:, id:)
        payload = line[5:].strip()
        if payload == b"[DONE]":
            self.done = True
            return
        if self.done:
            raise StreamError(f"data after [DONE]: {payload[:80]!r}")
        try:
            obj = json.loads(payload)
        except ValueError:
            raise StreamError(f"malformed chunk: {payload[:80]!r}") from None
        if not isinstance(obj, dict):
            raise StreamError(f"malformed chunk (not a JSON object): {payload[:80]!r}")
        if obj.get("error"):
            err = obj["error"]
            msg = err.get("message", err) if isinstance(err, dict) else err
            raise StreamError(f"server error in stream: {str(msg)[:200]}")
        if self._has_output(obj):
            self.chunk_times.append(now)

    def _has_output(self, obj: dict[str, Any]) -> bool:
        if self.mode == "chat":
            usage = obj.get("usage")
            if isinstance(usage, dict):
                self.usage_output = usage.get("completion_tokens", self.usage_output)
                self.usage_input = usage.get("prompt_tokens", self.usage_input)
            for choice in obj.get("choices") or ():
                delta = choice.get("delta") or {}
                if delta.get("content") or delta.get("reasoning_content"):
                    return True
            return False
        meta = obj.get("meta_info") or {}
        self.usage_input = meta.get("prompt_tokens", self.usage_input)
        completion = meta.get("completion_tokens")
        text = obj.get("text") or ""
        grew = False
        if completion is not None:
            grew = completion > (self.usage_output or 0)
            self.usage_output = completion
        else:
            grew = bool(text)  # no token counts: every chunk with text is taken as output
        return grew

    def finish(self, end: float) -> dict[str, Any]:
        """The measurement part of the record; raises StreamError when the stream did not complete."""
        if not self.done:
            raise StreamError(f"stream ended before [DONE] after {len(self.chunk_times)} output chunks")
        if not self.chunk_times:
            raise StreamError("stream finished without output")
        counted = len(self.chunk_times)
        out = self.usage_output if self.usage_output else counted
        ttft = self.chunk_times[0] - self.start
        e2e = end - self.start
        return {
            "ttft": ttft,
            "itl": [b - a for a, b in zip(self.chunk_times, self.chunk_times[1:], strict=False)],
            "tpot": (e2e - ttft) / (out - 1) if out > 1 else None,
            "e2e": e2e,
            "output_tokens": out,
            "output_chunks": counted,
            "tokens_from": "usage" if self.usage_output else "counted",
            "input_tokens": self.usage_input,
        }
