"""The jobs: what a request becomes (jobs.py, block.py), prepared from an OpenAI body
(prepare.py, oai/) and answered back (oai/). No llama.cpp call: nothing here imports
binding/ or contexts/."""
