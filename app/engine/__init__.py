"""Inference: the engine contract and its llama.cpp implementation."""
