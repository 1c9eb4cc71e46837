"""What the tests and the benches both stand up around batchyard, in one home that imports
neither `tests` nor `bench` (tests/unit/test_bench_apart.py checks it):

- `live`: `batchyard serve` from a checkout, as a real process on a free port;
- `seaweed`, `postgres`: a real SeaweedFS (S3) and a private PostgreSQL cluster;
- `upstream`: the fixed-latency stand-in for an OpenAI-compatible upstream;
- `faults`: the fault run (kill a node, restart PostgreSQL and SeaweedFS mid-batch);
- `random_models`, `vision_model`: GGUF files written here (random weights, a vision pair);
- `waiting`: `until`, the one wait loop.

It imports only public names of `app`. Test doubles that only tests use stay in tests/.
"""
