"""The OpenAI surface: thin controllers over the services."""
