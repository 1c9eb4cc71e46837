"""PyInstaller runtime hook: point llama-cpp-python at the shared libraries inside the bundle.

llama_cpp looks for libllama.so beside its own modules unless LLAMA_CPP_LIB_PATH says
otherwise (MTMD_CPP_LIB for libmtmd). The spec puts the libraries at llama_cpp/lib inside
the bundle; saying so explicitly keeps a frozen app from picking up another install's
libraries, while a path the user set on purpose still wins.
"""

from __future__ import annotations

import os
import sys

_bundle = getattr(sys, "_MEIPASS", None)
if _bundle is not None:
    _lib = os.path.join(_bundle, "llama_cpp", "lib")
    if os.path.isdir(_lib):
        os.environ.setdefault("LLAMA_CPP_LIB_PATH", _lib)
        os.environ.setdefault("MTMD_CPP_LIB", _lib)
