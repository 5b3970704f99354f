#!/usr/bin/env bash
# Sanitizer builds of the CPU configuration (no CUDA, no benchmarks), clang.
#   scripts/sanitize.sh asan   ASan + UBSan (UB fatal) into build-asan, with the
#                              libFuzzer targets (fuzz/, run by scripts/fuzz.sh);
#                              runs ctest -L 'unit|integration' there.
#   scripts/sanitize.sh tsan   ThreadSanitizer into build-tsan, only the
#                              concurrency tests (executor, in-process
#                              communicator, EP group, IR registry overrides,
#                              RunMoE coalescing, the shared-memory channels'
#                              protocol), none of which uses gRPC;
#                              runs them.
# The distribution's gRPC, protobuf and abseil are not instrumented: fine for
# ASan/UBSan; for TSan the tests chosen do not go through gRPC and
# .ci/tsan.supp names what is left, with a reason per line.
# Environment: BUILD_DIR overrides the build folder, JOBS the parallelism (2).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
mode=${1:?usage: scripts/sanitize.sh asan|tsan}
jobs=${JOBS:-2}
export CC=${CC:-clang} CXX=${CXX:-clang++}
common=(-G Ninja -DKPLAN_CUDA=OFF -DKPLAN_BUILD_BENCHMARKS=OFF -DKPLAN_BUILD_TESTS=ON
        -DKPLAN_WERROR=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo
        "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -gline-tables-only"
        "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -gline-tables-only")
case "$mode" in
  asan)
    build=${BUILD_DIR:-build-asan}
    cmake -S . -B "$build" "${common[@]}" -DKPLAN_SANITIZE=asan -DKPLAN_FUZZ=ON
    # Test discovery runs the binaries at build time; leaks at --gtest_list_tests
    # are not worth a failed build.
    ASAN_OPTIONS=detect_leaks=0 ninja -C "$build" -j"$jobs"
    export ASAN_OPTIONS="detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=1:check_initialization_order=1:abort_on_error=0"
    export LSAN_OPTIONS="suppressions=$root/.ci/lsan.supp:print_suppressions=0"
    export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
    # Tests that cannot run under ASan, each with its reason:
    # - AllocationFailureOnAChunkIsResourceExhausted: ASan's operator new
    #   reports out-of-memory and aborts instead of throwing std::bad_alloc
    #   (allocator_may_return_null covers malloc only), so the server's answer
    #   to bad_alloc exists in the release build alone; the test step runs it.
    skip=(LimitsTest.AllocationFailureOnAChunkIsResourceExhausted)
    exclude=()
    [ ${#skip[@]} -eq 0 ] || exclude=(-E "$(IFS='|'; echo "${skip[*]}")")
    ctest --test-dir "$build" -L 'unit|integration' "${exclude[@]}" \
      --output-on-failure -j"$jobs" --timeout 600
    ;;
  tsan)
    build=${BUILD_DIR:-build-tsan}
    targets=(exec_test comm_in_process_test ep_group_test ir_test moe_coalesce_test
             rpc_shm_channel_protocol_test)
    cmake -S . -B "$build" "${common[@]}" -DKPLAN_SANITIZE=tsan -DKPLAN_FUZZ=OFF
    TSAN_OPTIONS=report_bugs=0 ninja -C "$build" -j"$jobs" "${targets[@]}"
    export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$root/.ci/tsan.supp"
    failed=()
    for t in "${targets[@]}"; do
      echo "== tsan: $t"
      # ir_test: the registry's scoped overrides run concurrently in
      # registry_test.cc; the CPU op tests run too (cheap).
      if ! "$build/bin/$t" --gtest_brief=1; then failed+=("$t"); fi
    done
    if [ ${#failed[@]} -ne 0 ]; then
      echo "tsan: FAILED: ${failed[*]}" >&2
      exit 1
    fi
    echo "tsan: all ${#targets[@]} targets clean"
    ;;
  *)
    echo "usage: scripts/sanitize.sh asan|tsan" >&2
    exit 2
    ;;
esac
