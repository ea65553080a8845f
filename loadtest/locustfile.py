"""Locust users for an SGLang server: one streamed request per task, measured and written as one JSON line.

    locust -f loadtest/locustfile.py --host http://127.0.0.1:30000 --headless -u 16 -r 16 -t 60s \\
        --lt-records requests.jsonl --lt-input-len 1024 --lt-output-len 256

`sglang-glm5 loadtest run` drives this file in a subprocess; it can also run on its own as above.
Measurement rules (how Locust 2.47 behaves, and what each rule avoids):
- The body is read with `resp.stream.readline()`: FastHttpUser's `iter_lines()` waits for 1 KiB and
  would inflate TTFT.
- With `stream=True` Locust stops the clock at the response headers; the row's response_time is set
  to the end-to-end time inside `catch_response`, so Locust's own table shows E2E latency.
- Locust's percentiles are bucketed; every figure of the report comes from the JSONL records.
- Closed loop: each user sends its next request as soon as the last one ends (no think time).
"""

from __future__ import annotations

import itertools
import json
import os
import time
from typing import Any, TextIO

import gevent
from geventhttpclient._parser import HTTPParseError
from geventhttpclient.response import HTTPConnectionClosed
from locust import FastHttpUser, constant, events, task

from sglang_glm5.loadtest.sse import StreamError, StreamMeter
from sglang_glm5.loadtest.workload import PromptSource, Workload, request_for

_NETWORK_ERRORS = (OSError, HTTPConnectionClosed, HTTPParseError, gevent.Timeout)
_MAX_DRAIN_LINES = 64  # lines read after [DONE] so that the connection can go back to the pool


class _State:
    workload = Workload()
    source = PromptSource(Workload())
    model = "default"
    api_key: str | None = None
    timeout = 600.0
    sink: TextIO | None = None
    counter = itertools.count()


@events.init_command_line_parser.add_listener
def _add_options(parser: Any) -> None:
    g = parser  # (an argument group would not take Locust's is_secret)
    g.add_argument("--lt-mode", choices=("chat", "generate"), default="chat", help="/v1/chat/completions or /generate")
    g.add_argument("--lt-input-len", type=int, default=1024, help="prompt length in words (~tokens)")
    g.add_argument("--lt-output-len", type=int, default=256, help="output tokens per request")
    g.add_argument("--lt-range-ratio", type=float, default=0.0, help="lengths uniform in [L*(1-r), L]")
    g.add_argument("--lt-seed", type=int, default=0, help="prompt seed")
    g.add_argument("--lt-salt", default="", help="varies the prompts (e.g. per repeat) under the same seed")
    g.add_argument("--lt-prompt-file", default=None, help="JSONL of {prompt|messages[, output_len]}")
    g.add_argument("--lt-no-ignore-eos", action="store_true", help="let the model stop at EOS")
    g.add_argument("--lt-model", default="default", help="model name sent in chat requests")
    g.add_argument("--lt-api-key", default=None, env_var="SGLANG_GLM5_API_KEY", is_secret=True, help="Bearer token")
    g.add_argument("--lt-timeout", type=float, default=600.0, help="seconds without data before a request fails")
    g.add_argument("--lt-records", default="loadtest_requests.jsonl", help="per-request JSONL output (appended)")


@events.init.add_listener
def _on_init(environment: Any, **_kwargs: Any) -> None:
    opts = environment.parsed_options
    if opts is None:  # Locust used as a library without our options: keep the defaults
        return
    workload = Workload(
        mode=opts.lt_mode,
        input_len=opts.lt_input_len,
        output_len=opts.lt_output_len,
        range_ratio=opts.lt_range_ratio,
        seed=opts.lt_seed,
        ignore_eos=not opts.lt_no_ignore_eos,
    ).with_prompt_file(opts.lt_prompt_file)
    _State.workload = workload
    _State.source = PromptSource(workload, salt=opts.lt_salt)
    _State.model = opts.lt_model
    _State.api_key = opts.lt_api_key or None
    _State.timeout = opts.lt_timeout
    LLMUser.network_timeout = LLMUser.connection_timeout = opts.lt_timeout
    _State.sink = open(opts.lt_records, "a", buffering=1)  # noqa: SIM115 - line-buffered, closed on quit


@events.quitting.add_listener
def _on_quit(**_kwargs: Any) -> None:
    if _State.sink is not None:
        _State.sink.close()
        _State.sink = None


def _drop_connection(stream: Any) -> None:
    """Close a half-read connection instead of returning it to the keep-alive pool."""
    sock, pool = getattr(stream, "_sock", None), getattr(stream, "_pool", None)
    if sock is not None and pool is not None:
        pool.release_socket(sock)
        stream._sock = stream._pool = None


def _network_reason(exc: BaseException, chunks: int, timeout: float, streaming: bool) -> str:
    exc = getattr(exc, "original", None) or exc  # geventhttpclient's RetriesExceeded wraps the cause
    where = f"after {chunks} output chunks" if streaming else "before the response headers"
    if isinstance(exc, TimeoutError | gevent.Timeout):
        return f"timeout: no data for {timeout:g} s {where}"
    what = "connection closed mid-stream" if streaming else "connection failed"
    return f"{what} {where}: {type(exc).__name__}: {exc}"[:300]


class LLMUser(FastHttpUser):
    """Sends the workload's requests back to back and records each one."""

    wait_time = constant(0)
    network_timeout = 600.0
    connection_timeout = 600.0

    @task
    def stream_request(self) -> None:
        i = next(_State.counter)
        spec = _State.source.get(i)
        path, body = request_for(_State.workload, spec, _State.model)
        headers = {"Accept-Encoding": "identity", "Accept": "text/event-stream"}
        if _State.api_key:
            headers["Authorization"] = f"Bearer {_State.api_key}"
        record: dict[str, Any] = {"index": i, "start_unix": time.time(), "expected_output_tokens": spec.output_len}
        t0 = time.perf_counter()
        meter = StreamMeter(_State.workload.mode, t0)
        error: str | None = None
        end = t0
        with self.client.post(
            path, json=body, headers=headers, stream=True, catch_response=True, name=_State.workload.mode
        ) as resp:
            status = resp.status_code or 0
            try:
                if status == 0:
                    exc = getattr(resp, "error", None) or ConnectionError("no response")
                    error = _network_reason(exc, 0, _State.timeout, streaming=False)
                elif status != 200:
                    error = f"HTTP {status}: {_body_text(resp)}"
                else:
                    end = self._read_stream(resp.stream, meter)
                    record.update(meter.finish(end))
            except StreamError as e:
                error = str(e)
                _drop_connection(resp.stream)
            except _NETWORK_ERRORS as e:
                error = _network_reason(e, len(meter.chunk_times), _State.timeout, streaming=True)
                _drop_connection(resp.stream)
            if error is not None:
                end = time.perf_counter()
                record.update(e2e=end - t0, output_chunks=len(meter.chunk_times))
                if meter.chunk_times:
                    record["ttft"] = meter.chunk_times[0] - t0
            resp.request_meta["response_time"] = (end - t0) * 1000.0  # E2E, not time to headers
            resp.request_meta["response_length"] = meter.bytes_read
            if error is None:
                resp.success()
            else:
                resp.failure(error)
        record.update(ok=error is None, status=status, error=error)
        if _State.sink is not None:
            _State.sink.write(json.dumps(record) + "\n")

    @staticmethod
    def _read_stream(stream: Any, meter: StreamMeter) -> float:
        """Feed every SSE line to the meter; return the clock at [DONE] (or at the end of the body)."""
        while True:
            line = stream.readline(b"\n")
            now = time.perf_counter()
            if not line:
                return now
            meter.feed_line(line, now)
            if meter.done:
                for _ in range(_MAX_DRAIN_LINES):  # the terminating chunk, so the socket can be reused
                    if not stream.readline(b"\n"):
                        break
                return now


def _body_text(resp: Any) -> str:
    try:
        text = resp.content.decode("utf-8", "replace") if resp.content else ""
    except _NETWORK_ERRORS as e:
        text = f"(body unreadable: {type(e).__name__})"
    return " ".join(text.split())[:200]


if __name__ == "__main__":
    print(f"run with: locust -f {os.path.abspath(__file__)} --host http://127.0.0.1:30000")
