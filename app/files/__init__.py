"""The files domain: stored bytes (storage), their rows (service), streamed multipart
receive (multipart) and the Uploads API (uploads)."""
