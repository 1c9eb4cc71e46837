"""`batchyard engine`, `retry` and `models`: the commands that build, re-queue and list."""

from __future__ import annotations

import argparse
import sys

from app.cli.flags import settings_of
from app.config import Settings


def engine_command(args: argparse.Namespace) -> int:
    from app.toolchain import build

    if args.engine_command == "build":
        backend = args.backend or "cpu"
        if args.cuda_arch and backend != "cuda":
            print("batchyard engine build: --cuda-arch goes with --cuda", file=sys.stderr)
            return 2
        return build.build(
            backend, settings_of(args), sys.stdout, wheel=args.wheel, cuda_arch=args.cuda_arch
        )
    if args.engine_command == "status":
        for line in build.status(settings_of(args), check=args.check).lines():
            print(line)
        return 0
    print("usage: batchyard engine build [--cpu|--cuda|--metal|--vulkan] | batchyard engine status")
    return 2


def retry(settings: Settings, batch_id: str) -> int:
    from app.errors import APIError
    from app.services import build_services

    services = build_services(settings)
    try:
        owner = services.batches.owner_of(batch_id)
        new = services.batches.retry(batch_id, owner)
    except APIError as exc:
        print(f"batchyard retry: {exc.message}", file=sys.stderr)
        return 1
    finally:
        services.db.close()
    print(f"{new.id}")
    print(
        f"batchyard retry: {new.id} runs the failed lines of {batch_id} again "
        f"(metadata retry_of={batch_id}; {batch_id} has retried_by={new.id}). "
        f"`batchyard serve --data-dir {settings.data_path}` runs it.",
        file=sys.stderr,
    )
    return 0


def models(settings: Settings, *, as_json: bool = False) -> int:
    """Every model the catalog finds: its id, source, size, quantization, architecture,
    trained context, the memory it is estimated to take at its load profile and whether it
    takes images (has a projector)."""
    import json

    from app.catalog import Catalog
    from app.catalog.estimate import human_size

    try:
        entries = Catalog(settings).entries()
    except ValueError as exc:  # a bad models.toml, an unknown --default-model
        print(f"batchyard: {exc}", file=sys.stderr)
        return 1
    if as_json:
        rows = [
            {
                "id": e.id,
                "names": sorted(e.names),
                "source": e.source,
                "path": str(e.path),
                "size_bytes": e.size_bytes,
                "quantization": e.quantization,
                "architecture": e.architecture,
                "context_length": e.context_length,
                "estimated_bytes": e.estimate.total if e.estimate else None,
                "projector": str(e.projector) if e.projector else None,
                "ctx_size": e.profile.ctx_size,
                "parallel": e.profile.parallel,
                "kv_cache_type": e.profile.kv_cache_type,
                "default": e.is_default,
                "error": e.error,
            }
            for e in entries
        ]
        print(json.dumps(rows, indent=2))
        return 0
    header = ("ID", "SOURCE", "SIZE", "QUANT", "ARCH", "CONTEXT", "MEMORY", "INPUT")
    table = [header]
    for e in entries:
        memory = human_size(e.estimate.total) if e.estimate else "-"
        table.append(
            (
                e.id + (" *" if e.is_default else ""),
                e.source,
                human_size(e.size_bytes) if e.size_bytes else "missing",
                e.quantization,
                e.architecture or "-",
                str(e.context_length) if e.context_length else "-",
                memory,
                "text+image" if e.projector else "text",
            )
        )
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    right = {2, 5, 6}  # numbers line up on the right
    for row in table:
        cells = [
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ]
        print("  ".join(cells).rstrip())
    for e in entries:
        if e.error:
            print(f"{e.id}: {e.error} ({e.path})", file=sys.stderr)
    print(
        "* the default model. MEMORY: weights + KV cache + compute buffers (and a projector's "
        "share), estimated at each model's context x parallel (the server's flags, or "
        "models.toml's). INPUT: text+image for a model with a multimodal projector (mmproj).",
        file=sys.stderr,
    )
    return 0
