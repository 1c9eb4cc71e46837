"""The contexts: the slots and their scheduler, the slots context and the shared-prefix
context that decode them, the sequences a step samples, and the embedding decodes. Built on
binding/ and jobs/; the engine (engine.py) drives them."""
