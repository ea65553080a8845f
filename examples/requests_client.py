"""Talk to the server with plain `requests`: OpenAI chat completions (plain and streamed SSE) and
SGLang's native /generate.

    python examples/requests_client.py [--url http://127.0.0.1:30000] [--prompt "..."] [--timeout 300]

The API key comes from $SGLANG_GLM5_API_KEY when the server was started with --api-key.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

try:
    import requests
except ImportError:
    sys.exit("requests_client.py needs requests: pip install requests")

FIRST_TIMEOUT = 10.0  # seconds: /health and /v1/models answer at once on a running server


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:30000", help="server URL (http://127.0.0.1:30000)")
    parser.add_argument("--prompt", default="Explain NVFP4 in two sentences.")
    parser.add_argument("--max-tokens", type=int, default=256, help="most tokens per answer, every API (256)")
    parser.add_argument(
        "--timeout",
        type=float,
        default=300.0,
        help="seconds a request may wait for the server's next bytes (300; the first request: 10)",
    )
    args = parser.parse_args()
    try:
        talk(args)
    except requests.Timeout:
        print(
            f"requests_client.py: the server at {args.url} accepted the connection but did not answer in time "
            f"(--timeout {args.timeout:g} s; {min(args.timeout, FIRST_TIMEOUT):g} s for the first request); is it "
            "still starting?",
            file=sys.stderr,
        )
        return 1
    except requests.ConnectionError as e:
        print(
            f"requests_client.py: no server answers at {args.url} ({e}); start one (README: Serving)", file=sys.stderr
        )
        return 1
    except requests.HTTPError as e:
        print(f"requests_client.py: {e}", file=sys.stderr)
        return 1
    return 0


def talk(args: argparse.Namespace) -> None:
    headers = {}
    if key := os.environ.get("SGLANG_GLM5_API_KEY"):
        headers["Authorization"] = f"Bearer {key}"
    first = min(FIRST_TIMEOUT, args.timeout)
    requests.get(f"{args.url}/health", headers=headers, timeout=first).raise_for_status()
    model = requests.get(f"{args.url}/v1/models", headers=headers, timeout=first).json()["data"][0]["id"]
    body = {
        "model": model,
        "messages": [{"role": "user", "content": args.prompt}],
        "max_tokens": args.max_tokens,
        "temperature": 0,
    }

    # Chat completions, not streamed.
    r = requests.post(f"{args.url}/v1/chat/completions", json=body, headers=headers, timeout=args.timeout)
    r.raise_for_status()
    print(r.json()["choices"][0]["message"]["content"], "\n")

    # Chat completions, streamed: Server-Sent Events, one `data: {json}` line per chunk, then `data: [DONE]`.
    stream_body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    with requests.post(
        f"{args.url}/v1/chat/completions", json=stream_body, headers=headers, stream=True, timeout=args.timeout
    ) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            chunk = json.loads(data)
            for choice in chunk["choices"]:
                print(choice["delta"].get("content") or "", end="", flush=True)
            if chunk.get("usage"):
                print(f"\n[{chunk['usage']['completion_tokens']} completion tokens]\n")

    # SGLang's native API: /generate takes raw text (no chat template) and sampling_params.
    native = {"text": args.prompt, "sampling_params": {"max_new_tokens": args.max_tokens, "temperature": 0}}
    r = requests.post(f"{args.url}/generate", json=native, headers=headers, timeout=args.timeout)
    r.raise_for_status()
    out = r.json()
    print(out["text"], f"\n[{out['meta_info']['completion_tokens']} tokens]")


if __name__ == "__main__":
    sys.exit(main())
