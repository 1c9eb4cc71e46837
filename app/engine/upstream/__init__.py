"""The upstream engine: OpenAI-compatible servers (vLLM, SGLang, llama-server, Ollama) over
HTTP, with a window that adapts to what each one takes."""
