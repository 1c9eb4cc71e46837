"""Inference: the engine contract, the registry that routes by model, and the two engines
(llama/ embedded, upstream/ over HTTP)."""
