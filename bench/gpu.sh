#!/usr/bin/env bash
# batchyard's embedded engine on an NVIDIA GPU against llama.cpp's llama-server, side by side,
# on a machine that reaches no registry: everything comes from the kit bench/gpu_kit.sh built
# (at most 64 MiB: wheels, the llama-cpp-python sources, SmolLM2's tokenizer). Steps:
#   1. batchyard's dependencies from the kit's wheels into WORK/site (on PYTHONPATH, over the
#      machine's python3, whose nvidia-cublas wheel, if any, gives the build cuBLAS);
#   2. one CMake build of the kit's llama.cpp with the CUDA flags `engine build --cuda` uses
#      (app/toolchain/cuda.py, architecture 90: the H200), shared libraries and llama-server:
#      batchyard loads the libraries through LLAMA_CPP_LIB_PATH (llama_cpp's Python part is
#      installed from the same sources with LLAMA_BUILD=OFF), llama-server is the baseline;
#   3. random-weight models of SmolLM2-135M's exact shapes and of about 1B parameters
#      (bench/gpu_models.py; written during the compile);
#   4. bench/throughput.py's short, long, embed and shared workloads with --n-gpu-layers -1 on
#      the 135M model, short and shared on the 1B one, against llama-server with the same
#      slots; then one table. About 8 minutes on 16 cores and an H200.
# Usage: bash bench/gpu.sh [--cpu] [--quick] [KIT_DIR]       (KIT_DIR default: .gpukit)
#   --cpu    a dry run where there is no GPU: the same steps without the CUDA flags, no layers
#            offloaded;  --quick  8 lines a workload and only the short one on the 1B model.
# BATCHYARD_GPU_WORK: the work directory (default /tmp/batchyard-gpu). The log and the table
# go to $OUT too where it is set (the device machine sends that folder back).
# On the device tool: `bash bench/gpu_kit.sh` here first, then run `bash bench/gpu.sh` with
# carry [".gpukit"] and timeout_s 600 (the checkout, 4 MB, and the kit, 51 MiB, fit its 64).
set -euo pipefail
cd "$(dirname "$0")/.."

CPU=0
QUICK=0
while [ $# -gt 0 ]; do
  case "$1" in
    --cpu) CPU=1 ;;
    --quick) QUICK=1 ;;
    -*) echo "usage: bash bench/gpu.sh [--cpu] [--quick] [KIT_DIR]" >&2; exit 2 ;;
    *) break ;;
  esac
  shift
done
KIT=$(cd "${1:-.gpukit}" && pwd)
WORK=${BATCHYARD_GPU_WORK:-/tmp/batchyard-gpu}
RESULTS=${OUT:-$WORK}
PY=${PYTHON:-python3}
JOBS=$(nproc)
VERSION=$(sed -n 's/.*"llama-cpp-python==\([^"]*\)".*/\1/p' pyproject.toml)
T0=$(date +%s)
mkdir -p "$WORK" "$RESULTS"
LOG=$RESULTS/gpu-bench.log
: >"$LOG"
say() { echo "[gpu.sh +$(($(date +%s) - T0))s] $*" | tee -a "$LOG"; }

say "machine: $JOBS cores, $($PY --version 2>&1), $(cmake --version | head -1)," \
  "GPU: $(nvidia-smi -L 2>/dev/null | head -1 || true)"
[ "$CPU" = 1 ] || say "nvcc: $(nvcc --version | tail -1)"

say "1. batchyard's dependencies from $KIT/wheels"
rm -rf "$WORK/site" "$WORK/llama_cpp_python-$VERSION"
$PY -m pip install -q --no-index --no-deps --no-compile --disable-pip-version-check \
  --target "$WORK/site" "$KIT"/wheels/*.whl
export PYTHONPATH=$WORK/site
tar -xJf "$KIT/llama-cpp-python-$VERSION-src.tar.xz" -C "$WORK"
SRC=$WORK/llama_cpp_python-$VERSION
CMAKE_ARGS="-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF" $PY -m pip install -q --no-index --no-deps \
  --no-build-isolation --disable-pip-version-check --target "$WORK/site" "$SRC"

say "3. models, in the background"
MODELS=$WORK/models
WANT=smollm2-135m-random,llama-1b-random
$PY bench/gpu_models.py write "$KIT/tokenizer.json.gz" "$MODELS" "$WANT" >"$WORK/models.log" 2>&1 &
MODELS_PID=$!

FIX="-include $PWD/app/toolchain/amx_tilecfg.h"
CUDA_CMAKE=""
NGL=0
if [ "$CPU" = 0 ]; then
  say "CUDA architectures engine build --cuda would pick: $($PY -m app.toolchain.cuda archs)"
  CUDA_CMAKE=$($PY -m app.toolchain.cuda cmake-args 90)
  FIX="$FIX $($PY -m app.toolchain.cuda c-flags 90)"
  NGL=-1
fi
say "2. llama.cpp $VERSION: libllama and llama-server, ${CUDA_CMAKE:-CPU only}"
B0=$(date +%s)
BUILD=$WORK/build
# shellcheck disable=SC2086
CFLAGS="$FIX" CXXFLAGS="$FIX" cmake -S "$SRC/vendor/llama.cpp" -B "$BUILD" -G Ninja \
  -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON \
  -DLLAMA_BUILD_SERVER=ON -DLLAMA_USE_PREBUILT_UI=OFF -DGGML_NATIVE=ON $CUDA_CMAKE >"$WORK/build.log" 2>&1 ||
  { tail -30 "$WORK/build.log" | tee -a "$LOG"; exit 1; }
cmake --build "$BUILD" -j "$JOBS" --target llama llama-server >>"$WORK/build.log" 2>&1 ||
  { tail -30 "$WORK/build.log" | tee -a "$LOG"; exit 1; }
say "   built in $(($(date +%s) - B0)) s"
export LLAMA_CPP_LIB_PATH=$BUILD/bin

wait "$MODELS_PID" || { cat "$WORK/models.log"; exit 1; }
tee -a "$LOG" <"$WORK/models.log"
$PY -m app.cli engine status --model "$MODELS/smollm2-135m-random.gguf" 2>&1 | tee -a "$LOG"

say "4. workloads, batchyard against llama-server, --n-gpu-layers $NGL"
ROWS=$WORK/rows.txt
: >"$ROWS"
run() {  # MODEL WORKLOAD [throughput.py flags]
  local model=$1 workload=$2
  shift 2
  local out=$WORK/$model-$workload.txt
  if ! $PY bench/throughput.py --workload "$workload" --model "$MODELS/$model.gguf" \
    --n-gpu-layers "$NGL" --server-bin "$BUILD/bin" --no-ceiling "$@" >"$out" 2>&1; then
    tail -20 "$out" | tee -a "$LOG"
    echo "| $model | $workload | failed (see $out) | | | | |" >>"$ROWS"
    return 0
  fi
  grep -E '^(round|workload=)' "$out" | tee -a "$LOG"
  grep -E "^\| $workload \(" "$out" | sed "s/^| /| $model | /" >>"$ROWS"
}
if [ "$QUICK" = 1 ]; then
  for w in short long embed shared; do run smollm2-135m-random "$w" --lines 8; done
  run llama-1b-random short --lines 8 --max-tokens 8
else
  for w in short long embed shared; do run smollm2-135m-random "$w"; done
  for w in short shared; do run llama-1b-random "$w"; done
fi

{
  echo
  echo "batchyard against llama-server, $([ "$CPU" = 1 ] && echo "CPU (dry run)" || nvidia-smi -L | head -1), --n-gpu-layers $NGL"
  echo "| model | workload (lines) | side | median wall s | wall ratio | median CPU s | CPU ratio |"
  echo "|---|---|---|---|---|---|---|"
  cat "$ROWS"
  echo "ratios: llama-server's seconds over batchyard's (above 1: batchyard is faster)"
  echo "total: $(($(date +%s) - T0)) s"
} | tee -a "$LOG" "$RESULTS/gpu-table.md"
