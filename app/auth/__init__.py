"""Who is asking: API keys, signed dashboard sessions, and the middleware that checks both."""
