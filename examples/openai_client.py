"""Talk to the server through the OpenAI SDK (`pip install openai`): one plain request, one streamed.

    python examples/openai_client.py [--url http://127.0.0.1:30000] [--prompt "..."] [--timeout 300]

The API key comes from $SGLANG_GLM5_API_KEY (any string when the server was started without --api-key).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

try:
    import openai
except ImportError:
    sys.exit("openai_client.py needs the OpenAI SDK: pip install openai")

FIRST_TIMEOUT = 10.0  # seconds: /v1/models answers at once on a running server


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:30000", help="server URL (http://127.0.0.1:30000)")
    parser.add_argument("--prompt", default="Explain NVFP4 in two sentences.")
    parser.add_argument("--max-tokens", type=int, default=256, help="most tokens per answer (256)")
    parser.add_argument(
        "--timeout", type=float, default=300.0, help="seconds a request may take (300; the first request: 10)"
    )
    args = parser.parse_args()
    client = openai.OpenAI(base_url=f"{args.url}/v1", api_key=os.environ.get("SGLANG_GLM5_API_KEY", "none"),
                           timeout=args.timeout, max_retries=0)  # fmt: skip
    try:
        talk(client, args)
    except openai.APITimeoutError:  # before APIConnectionError, its parent
        print(
            f"openai_client.py: the server at {args.url} accepted the connection but did not answer in time "
            f"(--timeout {args.timeout:g} s; {min(args.timeout, FIRST_TIMEOUT):g} s for the first request); is it "
            "still starting?",
            file=sys.stderr,
        )
        return 1
    except openai.APIConnectionError as e:
        print(f"openai_client.py: no server answers at {args.url} ({e}); start one (README: Serving)", file=sys.stderr)
        return 1
    except openai.APIStatusError as e:
        print(f"openai_client.py: the server at {args.url} answered {e.status_code}: {e.message}", file=sys.stderr)
        return 1
    return 0


def talk(client, args: argparse.Namespace) -> None:
    model = client.with_options(timeout=min(FIRST_TIMEOUT, args.timeout)).models.list().data[0].id
    messages = [{"role": "user", "content": args.prompt}]

    # Not streamed: one response with the whole answer and the token counts.
    reply = client.chat.completions.create(model=model, messages=messages, max_tokens=args.max_tokens, temperature=0)
    print(reply.choices[0].message.content)
    print(f"[{reply.usage.prompt_tokens} prompt tokens, {reply.usage.completion_tokens} completion tokens]\n")

    # Streamed: tokens as they come; the last chunk carries `usage` (include_usage).
    t0 = time.perf_counter()
    first = None
    stream = client.chat.completions.create(
        model=model,
        messages=messages,
        max_tokens=args.max_tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    for chunk in stream:
        for choice in chunk.choices:
            # GLM-5 with a reasoning parser sends its thinking as reasoning_content (an SGLang extra field)
            text = choice.delta.content or getattr(choice.delta, "reasoning_content", None) or ""
            if text and first is None:
                first = time.perf_counter() - t0
            print(text, end="", flush=True)
        if chunk.usage:
            elapsed = time.perf_counter() - t0
            n = chunk.usage.completion_tokens
            print(f"\n[time to first token {first * 1e3:.0f} ms, {n} tokens, {n / elapsed:.1f} tok/s]")


if __name__ == "__main__":
    sys.exit(main())
