"""The catalog: the GGUF models a user already has, by the names they use for them.

Read from the stores where the models already are (the data dir's or --models-dir folders,
Ollama, LM Studio, the Hugging Face hub cache), offline; it never downloads and never loads
a model. `entry.py` holds the contract (`Entry`, `LoadProfile`, `HeaderFacts`, `Estimate`)
that the engine pool, `/v1/models`, `batchyard models` and the dashboard read.

The `Catalog` class (catalog.py) answers:
- `entries()`: every model, the default first; a store that changed is read again, so a
  model added to any store shows up without a restart;
- `resolve(name)`: the entry a name means (an id, an alias, `name` for `name:latest`), or
  None for a name nothing known means;
- `default()`: the model of lines whose name means nothing known (--default-model, else
  --model, else the embedded SmolLM2);
- `route(name)`: `resolve(name)` or else `default()`;
- `get(id)`: the entry of that id; `names()`: every name of every entry.

Inside: `stores.py` (where each tool keeps its models, and the names it gives them),
`header.py` (a GGUF's facts, read with the `gguf` package and cached per file),
`presets.py` (models.toml), `estimate.py` (the memory a load takes, and why),
`catalog.py` (the Catalog), `budget.py` (the memory the loaded models may hold).
"""

from __future__ import annotations

from app.catalog.catalog import DEFAULT_ROUTE, Catalog, lookup, server_profile
from app.catalog.entry import SOURCES, Entry, Estimate, HeaderFacts, LoadProfile
from app.catalog.header import FILE_TYPES, quantization

__all__ = [
    "DEFAULT_ROUTE",
    "FILE_TYPES",
    "SOURCES",
    "Catalog",
    "Entry",
    "Estimate",
    "HeaderFacts",
    "LoadProfile",
    "lookup",
    "quantization",
    "server_profile",
]
