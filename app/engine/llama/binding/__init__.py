"""The native binding: the calls into llama.cpp and libmtmd (the model and its contexts, the
batch rows, the buffers a load allocates, the sampler chain, the grammar mask, the images).
Imports jobs/ for the types it fills, never contexts/."""
