"""The embedded engine: one thread owns a llama.cpp context and decodes every slot together
(continuous batching). The only part of batchyard that imports llama_cpp."""
