"""OpenAI bodies to jobs and back (chat, completions, embeddings, Responses, tools), without
a llama context: the parsing and answer shapes of the llama engine."""
