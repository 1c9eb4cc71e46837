"""Inference: the engine contract (base.py), the one seam past it that the runner and the API
use (node.py), the registry that routes by model, and the two engines (llama/ embedded,
upstream/ over HTTP)."""
