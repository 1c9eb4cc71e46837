"""The wire: every body the API takes or sends, as msgspec Structs named as openai-python
names its types, and the builders that make them from the tables. One module per area:
`common` (errors, pages), `files`, `batches`, `uploads`, `endpoints`, `inference` (models,
health, chat, completions, embeddings, responses), `thoughts` (a thinking model's thought
read from an answer).

The request Structs carry the JSON types; rules with their own messages (a known
endpoint, metadata limits, expiry ranges) stay in the services and are documented here
through `doc(...)`, so /schema says what is refused without msgspec's terser wording
replacing batchyard's. The inference bodies are validated by the engine, which names each
parameter and its limit; their Structs only describe them (see `EngineBody`).
"""

from __future__ import annotations
