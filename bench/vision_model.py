"""The vision model pair's command line (harness/vision_model.py writes it):

    python bench/vision_model.py DIR [--projector idefics3|gemma3|qwen2vl]

writes DIR/model.gguf and DIR/mmproj.gguf (harness/vision_model.py says what they hold).

    python bench/vision_model.py DIR --llama-server "$(bash bench/build_llama_server.sh)"

then starts that llama-server with `-m DIR/model.gguf --mmproj DIR/mmproj.gguf`, sends it
REQUEST (a question and a 160x96 red PNG as a data URL) and prints its answer and usage: the
prompt tokens batchyard must count alike.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.vision_model import (  # noqa: E402
    MMPROJ_FILE,
    MODEL_FILE,
    PROJECTORS,
    Projector,
    write,
)


def red_png() -> bytes:
    """The check's image: 160x96 pixels of (200, 30, 30), made with Pillow."""
    import io

    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (160, 96), (200, 30, 30)).save(out, "PNG")
    return out.getvalue()


def request() -> dict[str, Any]:
    """The llama-server check's chat request: a text part, then the image as a data URL."""
    import base64

    url = "data:image/png;base64," + base64.b64encode(red_png()).decode()
    return {
        "model": "vision",
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What colour is this picture?"},
                    {"type": "image_url", "image_url": {"url": url}},
                ],
            }
        ],
        "max_tokens": 16,
        "temperature": 0,
    }


def check_llama_server(bin_dir: Path, directory: Path, port: int = 8391) -> dict[str, Any]:
    """Start llama-server on the pair, send request(), return its answer (the JSON body)."""
    import httpx

    from bench.throughput import llama_server

    command = [
        str(bin_dir / "llama-server"), "-m", str(directory / MODEL_FILE),
        "--mmproj", str(directory / MMPROJ_FILE), "--port", str(port), "-c", "2048",
        "-np", "1", "-t", "2",
    ]  # fmt: skip
    with llama_server(command, port):
        reply = httpx.post(
            f"http://127.0.0.1:{port}/v1/chat/completions", json=request(), timeout=300
        )
        reply.raise_for_status()
        body: dict[str, Any] = reply.json()
        return body


def main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("dir", type=Path, help="where model.gguf and mmproj.gguf go")
    parser.add_argument("--source", type=Path, help="the SmolLM2 GGUF (default: embedded)")
    parser.add_argument(
        "--projector", choices=PROJECTORS, default="idefics3", help="the projector's kind"
    )
    parser.add_argument(
        "--llama-server", type=Path, metavar="BIN_DIR", help="then ask that llama-server"
    )
    parser.add_argument("--port", type=int, default=8391, help="llama-server's port")
    args: Any = parser.parse_args(argv)
    start = time.perf_counter()
    write(args.dir, args.source, Projector(kind=args.projector))
    for name in (MODEL_FILE, MMPROJ_FILE):
        path = args.dir / name
        print(f"{path} ({path.stat().st_size / 1e6:.1f} MB)")
    print(f"written in {time.perf_counter() - start:.1f} s")
    if args.llama_server:
        import json

        body = check_llama_server(args.llama_server, args.dir, args.port)
        print("answer:", json.dumps(body["choices"][0]["message"]["content"]))
        print("finish_reason:", body["choices"][0]["finish_reason"])
        print("usage:", json.dumps(body["usage"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
