"""A fake SGLang server for the load-test and router tests: SSE in SGLang's OpenAI format with known delays.

Each POST gets the next behaviour of a cycle: "ok" (role chunk at once, first token after `ttft`,
then one token every `gap`, a usage chunk, [DONE]), "close" (3 tokens, then the socket closes),
"500", "malformed" (2 tokens, then a chunk that is not JSON), "hang" (never answers).
Token k (0-based) is sent at request_time + ttft + k * gap on an absolute schedule, so sleep jitter
does not accumulate. Binds 127.0.0.1 on an ephemeral port.

``python tests/loadtest_server.py --lifetime 120`` runs one in a process of its own (what a test kills to stop a
worker mid-run): it prints its URL on the first line of stdout and exits after ``--lifetime`` seconds.
"""

from __future__ import annotations

import itertools
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MODEL = "fake/GLM-5-NVFP4"


class FakeSGLang:
    def __init__(self, ttft: float = 0.1, gap: float = 0.02, behaviours: tuple[str, ...] = ("ok",)) -> None:
        self.ttft, self.gap = ttft, gap
        self._cycle = itertools.cycle(behaviours)
        self._lock = threading.Lock()
        self.stopping = threading.Event()
        self.requests = 0
        self.flushes = 0
        self.unknown: list[str] = []  # requests for paths the fake does not serve, e.g. "GET /metrics"
        handler = type("Handler", (_Handler,), {"fake": self})
        self.httpd = _Server(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def next_behaviour(self) -> str:
        with self._lock:
            self.requests += 1
            return next(self._cycle)

    def __enter__(self) -> FakeSGLang:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self.httpd.shutdown()
        self.httpd.server_close()


class _Server(ThreadingHTTPServer):
    request_queue_size = 128  # the default 5 drops the SYNs of 16 users connecting at once (1 s retry)
    daemon_threads = True


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # small SSE writes must leave at once
    fake: FakeSGLang

    def log_message(self, *args: Any) -> None:
        pass

    def _json(self, obj: Any, status: int = 200) -> None:
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/fake_stats":  # the test's own window into this server (not an SGLang endpoint)
            self._json({"requests": self.fake.requests, "flushes": self.fake.flushes, "unknown": self.fake.unknown})
            return
        # What SGLang 0.5.23's HTTP server answers (srt/entrypoints/http_server.py), as far as the load test and
        # SGLang's router ask: the router reads /server_info and /model_info and names the engine by owned_by.
        if self.path in ("/health", "/health_generate", "/ready"):
            self._json({})
        elif self.path in ("/server_info", "/get_server_info"):
            self._json({"model_path": MODEL, "tp_size": 1, "dp_size": 1, "moe_runner_backend": "fake",
                        "version": "0.0-test", "frontend": "python"})  # fmt: skip
        elif self.path in ("/model_info", "/get_model_info"):
            self._json({"model_path": MODEL, "served_model_name": MODEL, "tokenizer_path": MODEL,
                        "is_generation": True, "model_type": "glm_moe_dsa"})  # fmt: skip
        elif self.path == "/v1/models":
            self._json({"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "sglang"}]})
        else:
            self.fake.unknown.append(f"GET {self.path}")
            self._json({"error": "not found"}, 404)

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        if self.path == "/flush_cache":
            self.fake.flushes += 1
            self._json({})
            return
        if self.path not in ("/v1/chat/completions", "/generate"):
            self.fake.unknown.append(f"POST {self.path}")
            self._json({"error": "not found"}, 404)
            return
        t0 = time.perf_counter()
        behaviour = self.fake.next_behaviour()
        if behaviour == "hang":
            self.fake.stopping.wait(60)
            self.close_connection = True
            return
        if behaviour == "500":
            self._json({"object": "error", "message": "injected failure", "code": 500}, 500)
            return
        if not body.get("stream"):
            self._json(self._complete(body, native=self.path == "/generate"))
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        native = self.path == "/generate"
        n = body["sampling_params"]["max_new_tokens"] if native else _max_tokens(body)
        if not native:
            self._event(self._chat_chunk({"role": "assistant", "content": ""}, None))
        for k in range(n):
            if behaviour == "close" and k == 3:
                self.connection.shutdown(socket.SHUT_RDWR)
                self.close_connection = True
                return
            if behaviour == "malformed" and k == 2:
                self._chunk(b"data: {this is not json\n\n")
                self._chunk(b"")
                return
            delay = t0 + self.fake.ttft + k * self.fake.gap - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            finish = "length" if k == n - 1 else None
            if native:
                meta = {"prompt_tokens": 7, "completion_tokens": k + 1, "finish_reason": finish}
                self._event({"text": " tok" * (k + 1), "meta_info": meta})
            else:
                self._event(self._chat_chunk({"content": " tok"}, finish))
        if not native:
            usage = {"prompt_tokens": 7, "completion_tokens": n, "total_tokens": 7 + n}
            self._event({"id": "x", "object": "chat.completion.chunk", "choices": [], "usage": usage})
        self._chunk(b"data: [DONE]\n\n")
        self._chunk(b"")

    @staticmethod
    def _chat_chunk(delta: dict[str, Any], finish: str | None) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return {"id": "x", "object": "chat.completion.chunk", "model": MODEL, "choices": [choice], "usage": None}

    def _complete(self, body: dict[str, Any], native: bool) -> dict[str, Any]:
        n = body.get("max_tokens") or body.get("sampling_params", {}).get("max_new_tokens", 1)
        if native:
            return {"text": " tok" * n, "meta_info": {"prompt_tokens": 7, "completion_tokens": n}}
        message = {"role": "assistant", "content": " tok" * n}
        usage = {"prompt_tokens": 7, "completion_tokens": n, "total_tokens": 7 + n}
        return {"id": "x", "object": "chat.completion", "choices": [{"index": 0, "message": message}], "usage": usage}

    def _event(self, obj: dict[str, Any]) -> None:
        self._chunk(b"data: " + json.dumps(obj).encode() + b"\n\n")

    def _chunk(self, data: bytes) -> None:
        """One HTTP/1.1 chunk; the empty one ends the body."""
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))


def _max_tokens(body: dict[str, Any]) -> int:
    # SGLang's router forwards the OpenAI field under its newer name.
    return body.get("max_tokens") or body.get("max_completion_tokens") or 1


def main() -> None:
    import argparse
    import sys

    p = argparse.ArgumentParser(description="a fake SGLang server on 127.0.0.1, for tests")
    p.add_argument("--ttft", type=float, default=0.1)
    p.add_argument("--gap", type=float, default=0.02)
    p.add_argument("--lifetime", type=float, default=120.0, help="seconds before it stops itself")
    args = p.parse_args()
    with FakeSGLang(ttft=args.ttft, gap=args.gap) as server:
        print(server.url, flush=True)
        sys.stdout.close()
        server.stopping.wait(args.lifetime)


if __name__ == "__main__":
    main()
