"""The llama.cpp build batchyard runs on: what is installed, the CPU check's verdict, and
`batchyard engine build|status`. Nothing here imports llama_cpp (engine/llama/ does)."""
