#!/usr/bin/env bash
# The test command: checks the include layering (fast, before anything is
# built), installs missing packages, checks the formatting (scripts/format.sh
# --check: clang-format, .clang-format), builds, runs every ctest test (labels
# unit, integration, gpu; gpu tests skip themselves without a GPU). Warnings
# are errors (KPLAN_WERROR; pass -DKPLAN_WERROR=OFF to look past them).
# Debug info is line tables only (-g1: file and line in a backtrace or a
# sanitizer report): with full -g the test binaries, each linking the
# server's libraries statically, took 3.0 GB (83 of rpc_moe_test's 95 MB were
# DWARF) and a CI machine ran out of disk. Pass
# -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g -DNDEBUG" (and the same for CUDA)
# for a debugging build.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 scripts/check_layering.py
bash scripts/install-deps.sh
bash scripts/format.sh --check || { echo "test.sh: run scripts/format.sh" >&2; exit 1; }
bash scripts/build.sh -DKPLAN_BUILD_TESTS=ON -DKPLAN_BUILD_BENCHMARKS=ON -DKPLAN_WERROR=ON \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG" \
  "-DCMAKE_CUDA_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG" "$@"
ctest --test-dir "${BUILD_DIR:-build}" --output-on-failure -j"${JOBS:-2}" --timeout 300
