"""batchyard: OpenAI's Files and Batch APIs on an embedded llama.cpp model."""

from __future__ import annotations

__version__ = "0.1.0"
