#!/usr/bin/env bash
# Configures and builds kplan into ./build (override with BUILD_DIR). Extra
# arguments go to cmake, e.g. -DKPLAN_CUDA=OFF.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
cmake -S . -B "$build" -G Ninja "$@"
ninja -C "$build" -j"${JOBS:-2}"
