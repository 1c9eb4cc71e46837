"""The fixed-latency upstream: a stand-in for an OpenAI-compatible server (a GPU server
answering short lines) that answers every `/v1/chat/completions` after `latency_ms` with one
token, and lists one model, MODEL, on `/v1/models`. It runs in a process of its own (aiohttp
on uvloop), so that what a bench measures is the front's own cost, and a test's front feeds
it as it would a real upstream.

A request for one of THINKERS (name them in the front's `models=`; `/v1/models` lists only
MODEL) is answered as a thinking model behind that server: its thought THOUGHT in the field
its server writes it in (`reasoning`: vLLM, Ollama; `reasoning_content`: llama-server,
SGLang; `inline`: `<think>...</think>` left in the content, as a server without its
reasoning parser), on `/v1/chat/completions` (whole or streamed) and `/v1/responses`. Its
answer proper echoes what it received (`echo`): the body less its messages, as JSON, so a
test reads what the front passed on.

    python -m harness.upstream PORT [--latency-ms 20]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from typing import Any

import httpx

from harness.live import ROOT, checkout_env, free_port, stop_process
from harness.waiting import until

#: The one model it lists and names in its answers.
MODEL = "fleet-model"
CHAT = "/v1/chat/completions"
RESPONSES = "/v1/responses"
#: The thinking models it answers for, and where each writes its thought.
THINKERS = {
    "vllm-thinker": "reasoning",  # vLLM, Ollama; counts the thought's tokens
    "llama-thinker": "reasoning_content",  # llama-server, SGLang; no count
    "inline-thinker": "inline",  # a server without its reasoning parser
}
THOUGHT = "Two and two make four."
#: The thought's tokens, where the thinker counts them (vLLM does, llama-server does not).
THOUGHT_TOKENS = 7
#: How a streamed thought is cut: across its tags too, where it is inline.
THOUGHT_PIECES = {
    "inline": ["<thi", "nk>Two and two", " make four.</th", "ink>\n\n"],
    "reasoning": ["Two and two", " make four."],
}
THOUGHT_PIECES["reasoning_content"] = THOUGHT_PIECES["reasoning"]


def echo(body: dict[str, Any]) -> str:
    """A thinker's answer proper: what it received, less the conversation, as JSON."""
    said = {k: v for k, v in body.items() if k not in ("messages", "input", "stream")}
    return json.dumps(said, sort_keys=True)


def _usage(style: str) -> dict[str, Any]:
    usage: dict[str, Any] = {"prompt_tokens": 9, "completion_tokens": 20, "total_tokens": 29}
    if style == "reasoning":
        usage["completion_tokens_details"] = {"reasoning_tokens": THOUGHT_TOKENS}
    return usage


def thinker_answer(body: dict[str, Any]) -> dict[str, Any]:
    """A thinker's whole chat answer, its thought where its server writes it."""
    style = THINKERS[body["model"]]
    message: dict[str, Any] = {"role": "assistant", "content": echo(body)}
    if style == "inline":
        message["content"] = f"<think>{THOUGHT}</think>\n\n{message['content']}"
    else:
        message[style] = THOUGHT
    choice = {"index": 0, "message": message, "finish_reason": "stop"}
    head = {"id": "chatcmpl-think", "created": int(time.time()), "model": body["model"]}
    return {**head, "object": "chat.completion", "choices": [choice], "usage": _usage(style)}


def thinker_events(body: dict[str, Any]) -> list[dict[str, Any]]:
    """A thinker's streamed chat answer: its chunks, the usage chunk when asked for."""
    style = THINKERS[body["model"]]
    head = {"id": "chatcmpl-think", "object": "chat.completion.chunk", "created": 1}
    head["model"] = body["model"]
    field = "content" if style == "inline" else style
    deltas = [{"role": "assistant", "content": ""}]
    deltas += [{field: piece} for piece in THOUGHT_PIECES[style]]
    deltas += [{"content": echo(body)}, {}]
    chunks: list[dict[str, Any]] = []
    for n, delta in enumerate(deltas, 1):
        finish = "stop" if n == len(deltas) else None
        chunks.append({**head, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
    if (body.get("stream_options") or {}).get("include_usage"):
        chunks.append({**head, "choices": [], "usage": _usage(style)})
    return chunks


def thinker_response(body: dict[str, Any]) -> dict[str, Any]:
    """A thinker's Responses answer: a reasoning item, as vLLM writes it, then the message."""
    style = THINKERS.get(body.get("model", ""), "")
    thought = {"type": "reasoning_text", "text": THOUGHT}
    reasoning = {"id": "rs_think", "type": "reasoning", "summary": [], "content": [thought]}
    text = {"type": "output_text", "text": echo(body), "annotations": []}
    message = {"id": "msg_think", "type": "message", "role": "assistant", "content": [text]}
    message["status"] = reasoning["status"] = "completed"
    usage: dict[str, Any] = {"input_tokens": 9, "output_tokens": 20, "total_tokens": 29}
    if style == "reasoning":
        usage["output_tokens_details"] = {"reasoning_tokens": THOUGHT_TOKENS}
    return {
        "id": "resp_think",
        "object": "response",
        "created_at": int(time.time()),
        "status": "completed",
        "model": body.get("model", MODEL),
        "output": [reasoning, message],
        "usage": usage,
    }


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

    async def chat(request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        await asyncio.sleep(latency_ms / 1000)
        if b"-thinker" not in raw:  # the benches' lines: no JSON read, the answer made once
            return web.Response(body=body, content_type="application/json")
        asked = json.loads(raw)
        if not asked.get("stream"):
            return web.json_response(thinker_answer(asked))
        events = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await events.prepare(request)
        for chunk in thinker_events(asked):
            await events.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        await events.write(b"data: [DONE]\n\n")
        return events

    async def responses(request: web.Request) -> web.Response:
        asked = await request.json()
        await asyncio.sleep(latency_ms / 1000)
        return web.json_response(thinker_response(asked))

    async def list_models(request: web.Request) -> web.Response:  # noqa: ARG001 - aiohttp's
        return web.Response(body=models, content_type="application/json")

    app = web.Application()
    app.router.add_post(CHAT, chat)
    app.router.add_post(RESPONSES, responses)
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
