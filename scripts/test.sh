#!/usr/bin/env bash
# The test command: installs missing packages, builds, runs every ctest test
# (labels unit, integration, gpu; gpu tests skip themselves without a GPU).
# Tests labelled pending_fix (they fail until a server fix lands) are left
# out; .ci/run runs them as an advisory step.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh -DKPLAN_BUILD_TESTS=ON -DKPLAN_BUILD_BENCHMARKS=ON "$@"
ctest --test-dir "${BUILD_DIR:-build}" -LE pending_fix --output-on-failure -j"${JOBS:-2}" --timeout 300
