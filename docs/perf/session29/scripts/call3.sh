#!/usr/bin/env bash
# Session 29, device call 3: the quantised decode routes' suite at HEAD with
# memcheck and racecheck over the decode tiles and the matvec (session 27's
# code, never run under compute-sanitizer), and the 512-token channel call
# with the server's and client's spin longer than the bench's gap between
# calls (is call 2's 211-224 us "wire" the channel thread's wake-up?).
# Carry build-pack (dist.tar.xz of call 2, quant.tar.xz: moe_quant_gpu_test).
set -uo pipefail
tar -xJf build-pack/dist.tar.xz && tar -xJf build-pack/quant.tar.xz
o=${OUT:-/tmp/out}
mkdir -p "$o"
LD_LIBRARY_PATH=$PWD/.dist/lib timeout 60 .dist/bin/moe_rpc_bench --iters 100 --tokens 512 \
  --transport unix --channel_spin_us 30000 > "$o/moe_rpc_bench_spin30000.txt" 2>&1
grep -E "^unix|^#" "$o/moe_rpc_bench_spin30000.txt"
export LD_LIBRARY_PATH=$PWD/.dist2/lib
q=.dist2/bin/moe_quant_gpu_test
timeout 150 $q > "$o/quant_test.txt" 2>&1; echo "quant_test rc=$?"; tail -3 "$o/quant_test.txt"
timeout 120 compute-sanitizer --tool memcheck --error-exitcode 1 $q \
  --gtest_filter='*MatvecRoute*:*IntDequant*:*DecodeAndDequantRoutes*' > "$o/memcheck.txt" 2>&1
echo "memcheck rc=$?"; grep -E "ERROR SUMMARY|PASSED|FAILED" "$o/memcheck.txt" | tail -3
timeout 120 compute-sanitizer --tool racecheck --error-exitcode 1 $q \
  --gtest_filter='*MatvecRoute*:*DecodeAndDequantRoutes*' > "$o/racecheck.txt" 2>&1
echo "racecheck rc=$?"; grep -E "RACECHECK SUMMARY|ERROR SUMMARY|PASSED|FAILED" "$o/racecheck.txt" | tail -3
