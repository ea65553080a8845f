"""A fake SGLang server for the load-test and router tests: SSE in SGLang's OpenAI format with known delays.

Each POST gets the next behaviour of a cycle: "ok" (role chunk at once, first token after `ttft`,
then one token every `gap`, a usage chunk, [DONE]), "close" (3 tokens, then the socket closes),
"500", "malformed" (2 tokens, then a chunk that is not JSON), "hang" (never answers).

Accuracy A/B (loadtest accuracy): /generate answers SGLang's prompt-logprob options (`return_logprob`,
`logprob_start_len`, `top_logprobs_num`) in SGLang 0.5.23's format, over a toy model: words hash to
ids in [0, VOCAB) (`tokenize`), and the next-token distribution after token `prev` at position `pos`
is a seeded log-softmax (`next_token_logprobs`), shifted by `perturb` x seeded noise on a "patched"
fake. Non-streamed chat requests that quote a question of `answers` get "Answer: N", right except
for the questions in `wrong` (answered N + 1). `logprobs=False` ignores the logprob options (a
server without them); `die_after=N` shuts the whole server down on request N + 1 (it never answers).
Token k (0-based) is sent at request_time + ttft + k * gap on an absolute schedule, so sleep jitter
does not accumulate. Binds 127.0.0.1 on an ephemeral port (or `port`).

`python tests/loadtest_server.py [--port P] [--perturb X] [--wrong-every N] [--lifetime S]` serves one in a
process of its own (scripts/run_loadtest.sh's test starts it as its "server"; the router test kills one to
stop a worker mid-run): it prints its URL on the first line of stdout and exits after --lifetime seconds.
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import socket
import threading
import time
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np

MODEL = "fake/GLM-5-NVFP4"
VOCAB = 256


def tokenize(text: str, salt: int = 0) -> list[int]:
    """Word and punctuation pieces -> ids in [0, VOCAB); another salt is another tokenizer."""
    return [(zlib.crc32(w.encode()) + salt) % VOCAB for w in re.findall(r"\w+|[^\w\s]", text)]


def next_token_logprobs(prev: int, pos: int, model_seed: int, perturb: float = 0.0, noise_seed: int = 0) -> np.ndarray:
    """The toy model's full next-token log-probabilities [VOCAB] after token `prev` at position `pos`."""
    logits = 2.5 * np.random.default_rng([model_seed, prev, pos]).standard_normal(VOCAB)
    if perturb:
        logits = logits + perturb * np.random.default_rng([noise_seed, prev, pos, 1]).standard_normal(VOCAB)
    m = logits.max()
    return logits - (m + np.log(np.exp(logits - m).sum()))


class FakeSGLang:
    def __init__(
        self,
        ttft: float = 0.1,
        gap: float = 0.02,
        behaviours: tuple[str, ...] = ("ok",),
        *,
        model_seed: int = 0,
        perturb: float = 0.0,
        noise_seed: int = 0,
        tokenizer_salt: int = 0,
        logprobs: bool = True,
        answers: dict[str, float] | None = None,
        wrong: frozenset[str] = frozenset(),
        die_after: int | None = None,
        port: int = 0,
    ) -> None:
        self.ttft, self.gap = ttft, gap
        self.model_seed, self.perturb, self.noise_seed = model_seed, perturb, noise_seed
        self.tokenizer_salt, self.logprobs = tokenizer_salt, logprobs
        self.answers, self.wrong, self.die_after = answers or {}, wrong, die_after
        self._cycle = itertools.cycle(behaviours)
        self._lock = threading.Lock()
        self.stopping = threading.Event()
        self.requests = 0
        self.flushes = 0
        self.unknown: list[str] = []  # requests for paths the fake does not serve, e.g. "GET /metrics"
        handler = type("Handler", (_Handler,), {"fake": self})
        self.httpd = _Server(("127.0.0.1", port), handler)
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

    def die(self) -> None:
        """Stop listening, from a handler thread: later connections are refused."""
        threading.Thread(target=self.__exit__, daemon=True).start()

    def prompt_logprobs(self, text: str, top_k: int) -> dict[str, Any]:
        """meta_info fields as SGLang 0.5.23 returns them for logprob_start_len 0 (first prompt token: None)."""
        ids = tokenize(text, self.tokenizer_salt)
        tokens: list[list[Any]] = [[None, ids[0], None]] if ids else []
        tops: list[Any] = [None] if ids else []
        for pos in range(1, len(ids)):
            lp = next_token_logprobs(ids[pos - 1], pos, self.model_seed, self.perturb, self.noise_seed)
            tokens.append([float(lp[ids[pos]]), ids[pos], None])
            order = np.argsort(-lp, kind="stable")[:top_k]
            tops.append([[float(lp[t]), int(t), None] for t in order])
        return {"input_token_logprobs": tokens, "input_top_logprobs": tops, "prompt_tokens": len(ids)}

    def solve(self, content: str) -> str:
        for question, answer in self.answers.items():
            if question in content:
                value = answer + 1 if question in self.wrong else answer
                return f"Adding it up step by step.\nAnswer: {value:g}"
        return "I cannot tell."


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
        if self.fake.die_after is not None and self.fake.requests > self.fake.die_after:
            self.close_connection = True
            self.fake.die()
            return
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
            meta: dict[str, Any] = {"prompt_tokens": 7, "completion_tokens": n}
            if body.get("return_logprob") and self.fake.logprobs:
                meta.update(self.fake.prompt_logprobs(body["text"], int(body.get("top_logprobs_num") or 0)))
            return {"text": " tok" * n, "meta_info": meta}
        content = " tok" * n
        if self.fake.answers:
            content = self.fake.solve(body["messages"][-1]["content"])
        message = {"role": "assistant", "content": content}
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
    import sys

    from sglang_glm5.loadtest import corpus

    ap = argparse.ArgumentParser(description="a fake SGLang server on 127.0.0.1, for tests")
    ap.add_argument("--port", type=int, default=0, help="port (default: an ephemeral one)")
    ap.add_argument("--ttft", type=float, default=0.01)
    ap.add_argument("--gap", type=float, default=0.002)
    ap.add_argument("--perturb", type=float, default=0.0, help="noise scale on the toy model's logits")
    ap.add_argument("--wrong-every", type=int, default=0, help="answer every N-th generated problem wrong")
    ap.add_argument("--problems", type=int, default=corpus.DEFAULT_PROBLEMS, help="generated problems it knows")
    ap.add_argument("--lifetime", type=float, default=120.0, help="seconds before it stops itself")
    args = ap.parse_args()
    problems = corpus.generated_problems(args.problems)
    wrong = {p.question for i, p in enumerate(problems) if args.wrong_every and i % args.wrong_every == 0}
    answers = {p.question: p.answer for p in problems}
    fake = FakeSGLang(args.ttft, args.gap, perturb=args.perturb, noise_seed=1, answers=answers,
                      wrong=frozenset(wrong), port=args.port)  # fmt: skip
    with fake:
        print(fake.url, flush=True)
        sys.stdout.close()
        fake.stopping.wait(args.lifetime)


if __name__ == "__main__":
    main()
