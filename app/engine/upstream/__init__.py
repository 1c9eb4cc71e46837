"""The upstream engine: OpenAI-compatible servers (vLLM, SGLang, llama-server, Ollama) over
HTTP, with a window that adapts to what each one takes; each one's client runs in a process
of its own (process.py, child.py). The wire each speaks is its kind's module (kinds/)."""

#: The hidden `batchyard` subcommand the single binary runs an upstream's client process
#: through (app/cli/__init__.py: main; process.py starts it).
UPSTREAM_COMMAND = "_upstream"
