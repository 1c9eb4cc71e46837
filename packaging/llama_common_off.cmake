# Included by packaging/llama_wheel.sh right after llama-cpp-python's project(): turns off
# llama.cpp's common library (the helpers of its own command line tools: argument parsing,
# an HTTP client, JSON chat parsers). llama_cpp never loads it, but its CMakeLists forces the
# cache variable on, so -DLLAMA_BUILD_COMMON=OFF cannot. A normal variable set here still
# wins: that set(... CACHE ... FORCE) leaves normal variables alone (policy CMP0126, NEW
# under its cmake_minimum_required 3.21), and llama.cpp's option() defers to one (CMP0077).
set(LLAMA_BUILD_COMMON OFF)
