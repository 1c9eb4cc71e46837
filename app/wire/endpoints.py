"""The inference endpoints, by their OpenAI path: what a batch line's `url` may name and what
an engine serves."""

from __future__ import annotations

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
EMBEDDINGS = "/v1/embeddings"
#: Runs on the chat path (engine/llama/jobs/oai/responses_request.py and responses_answer.py
#: translate).
RESPONSES = "/v1/responses"
ENDPOINTS = (CHAT, COMPLETIONS, EMBEDDINGS, RESPONSES)
