"""The fixed-latency upstream: a stand-in for an OpenAI-compatible server (a GPU server
answering short lines) that answers every `/v1/chat/completions` after `latency_ms` with one
token, and lists one model, MODEL, on `/v1/models`. It runs in a process of its own (aiohttp
on uvloop), so that what a bench measures is the front's own cost, and a test's front feeds
it as it would a real upstream.

    python -m harness.upstream PORT [--latency-ms 20]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time

import httpx

from harness.live import ROOT, checkout_env, free_port, stop_process
from harness.waiting import until

#: The one model it lists and names in its answers.
MODEL = "fleet-model"
CHAT = "/v1/chat/completions"


def serve_upstream(port: int, latency_ms: float) -> None:
    """Run the fixed-latency upstream (the child process's whole life)."""
    import uvloop
    from aiohttp import web

    answer = {
        "id": "chatcmpl-fleet",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": MODEL,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "A"},
                "finish_reason": "length",
            }
        ],
        "usage": {"prompt_tokens": 9, "completion_tokens": 1, "total_tokens": 10},
    }
    body = json.dumps(answer).encode()
    models = json.dumps(
        {"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "bench"}]}
    ).encode()

    async def chat(request: web.Request) -> web.Response:
        await request.read()
        await asyncio.sleep(latency_ms / 1000)
        return web.Response(body=body, content_type="application/json")

    async def list_models(request: web.Request) -> web.Response:  # noqa: ARG001 - aiohttp's
        return web.Response(body=models, content_type="application/json")

    app = web.Application()
    app.router.add_post(CHAT, chat)
    app.router.add_get("/v1/models", list_models)
    uvloop.install()
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None, backlog=1024)


def start_upstream(latency_ms: float) -> tuple[subprocess.Popen[bytes], str]:
    """Start it on a free port; its process (stop it with `stop_process`) and its root URL."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness.upstream", str(port), "--latency-ms", str(latency_ms)],
        cwd=ROOT,
        env=checkout_env(),
    )
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"the fixed-latency upstream exited with {proc.returncode}")
        return httpx.get(url + "/v1/models", timeout=2).status_code == 200

    try:
        until(
            up, 30, "the fixed-latency upstream's /v1/models", poll=0.1, ignoring=(httpx.HTTPError,)
        )
    except BaseException:
        stop_process(proc)
        raise
    return proc, url


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("port", type=int)
    p.add_argument("--latency-ms", type=float, default=20.0)
    args = p.parse_args(argv)
    serve_upstream(args.port, args.latency_ms)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
