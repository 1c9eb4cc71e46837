"""Reading GET /metrics (Prometheus' text exposition) in tests: its samples and one value."""

from __future__ import annotations

import re

import httpx

SAMPLE = re.compile(r"^([a-z_]+)(\{(.*)\})? (\S+)$")


def parse(text: str) -> tuple[dict[str, str], list[tuple[str, dict[str, str], float]]]:
    """The exposition's TYPE lines and its samples (name, labels, value)."""
    types: dict[str, str] = {}
    samples = []
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            types[name] = kind
        elif line and not line.startswith("#"):
            m = SAMPLE.match(line)
            assert m, f"not a sample line: {line!r}"
            labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(3) or ""))
            samples.append((m.group(1), labels, float(m.group(4))))
    return types, samples


def scrape(root: str) -> list[tuple[str, dict[str, str], float]]:
    """The samples a live server's /metrics shows now (`root`: its URL without /v1)."""
    return parse(httpx.get(root + "/metrics", timeout=10).text)[1]


def value(samples: list, name: str, **labels: str) -> float:
    found = [
        v for n, lab, v in samples if n == name and all(lab.get(k) == x for k, x in labels.items())
    ]
    assert len(found) == 1, f"{name}{labels}: {found}"
    return found[0]
