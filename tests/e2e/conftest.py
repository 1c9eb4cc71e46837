"""Fixtures for the upstream engine's tests: a real `batchyard serve` as the upstream, a flaky
double in front of it, and a front `batchyard serve` with both as `--engine` upstreams."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.live import OUTPUT, start_server, stop_server
from tests.upstream_double import (
    FLAKY_BACKOFF_S,
    FLAKY_MODEL,
    FlakyUpstream,
    Fleet,
    upstream_model_args,
)


@pytest.fixture(scope="session")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    root = tmp_path_factory.mktemp("fleet")
    upstream = start_server(
        root / "upstream", OUTPUT / "upstream-server.log", args=upstream_model_args(root)
    )
    double = FlakyUpstream(upstream.url)
    try:
        front = start_server(
            root / "front",
            OUTPUT / "front-server.log",
            args=[
                "--parallel",
                "2",
                "--engine",
                f"up=openai:{upstream.api},concurrency=4",
                "--engine",
                f"flaky=openai:{double.api},models={FLAKY_MODEL},concurrency=4,retries=4,"
                f"backoff={FLAKY_BACKOFF_S}",
            ],
        )
    except Exception:
        double.close()
        stop_server(upstream)
        raise
    yield Fleet(upstream, double, front)
    stop_server(front)
    double.close()
    stop_server(upstream)
