"""The llama engine (`LlamaEngine`, one loaded model): one thread owns a llama.cpp context and
decodes every slot together (continuous batching). The only part of batchyard that imports llama_cpp."""

from __future__ import annotations

from app.toolchain.cuda import preload_runtime
from app.toolchain.facts import llama_lib_dir

# A CUDA build links cuBLAS and the CUDA runtime by name; where they came from a wheel or the
# toolkit rather than the system's library path, they are loaded here, before llama_cpp is.
preload_runtime(llama_lib_dir())
