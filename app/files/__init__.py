"""The files domain: stored bytes (storage), their rows (service), streamed uploads (upload)."""
