#!/usr/bin/env bash
# Session 34, device call 2: the int decode kernels with their scales (and the
# matvec's activations) in the cp.async ring (s34b) against b69ce58 (s34).
# - moe_quant_gpu_test whole (every route against the CPU reference), then
#   memcheck and racecheck over the matvec and decode-tile cases.
# - moe_bench int4_group and int8_group at 1, 2, 16, 64 tokens on the three
#   shapes, old and new alternating, and int4_group/fp32s on Mixtral-8x7B at
#   1 and 16 (each row checked against the CPU reference before it is timed).
# - ncu of the new matvec (Mixtral-8x7B one token, GEMM 1) and decode tile
#   (16 tokens, GEMM 1): where the stalls went.
set -uo pipefail
for p in s34 s34b; do
  tar -xJf build-pack/$p.tar.xz && mv .tdist .t_$p
done
. scripts/gpu-steps.sh
gpu_check_setup kplan-s34 .t_s34b
echo "old $(cat .t_s34/REV), new $(cat .t_s34b/REV)"
step_keep='FAIL|PASSED|ERROR SUMMARY|RACECHECK SUMMARY|rooflines|^(Mixtral|Qwen3|DeepSeek)|Duration|DRAM Throughput|Issue Slots Busy|Registers Per|Achieved Occ'
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv,noheader
step quant_test 150 "$bin/moe_quant_gpu_test"
step memcheck 100 compute-sanitizer --tool memcheck --error-exitcode 1 "$bin/moe_quant_gpu_test" \
  --gtest_filter='*MatvecRoute*:*DecodeAndDequantRoutes*:*SmallShapesTails*'
step racecheck 100 compute-sanitizer --tool racecheck --error-exitcode 1 "$bin/moe_quant_gpu_test" \
  --gtest_filter='*MatvecRoute*:*DecodeAndDequantRoutes*'
B=(--budget_s 0.2 --sets 2 --fused on --warmup_s 0.5 --check_tokens 2 --route auto
  --shapes qwen3,mixtral,deepseek --tokens 1,2,16,64)
for r in 1 2; do
  for v in s34 s34b; do
    LD_LIBRARY_PATH=$PWD/.t_$v/lib TAIL=40 step "bench_${v}_$r" 100 .t_$v/bin/moe_bench "${B[@]}" \
      --quant int4_group,int8_group --json "$out/bench_${v}_$r.json"
  done
done
for v in s34 s34b; do
  LD_LIBRARY_PATH=$PWD/.t_$v/lib TAIL=10 step "fp32s_$v" 60 .t_$v/bin/moe_bench "${B[@]}" \
    --shapes mixtral --tokens 1,16 --quant int4_group/fp32s --json "$out/fp32s_$v.json"
done
P=(--budget_s 0.01 --sets 1 --warmup_s 0 --check_tokens 0)
prof() {  # name kernel-regex skip bench-args...
  local name=$1 k=$2 skip=$3
  shift 3
  TAIL=8 step "ncu_$name" 120 ncu --clock-control none --set full --import-source yes \
    -k "regex:$k" --launch-skip "$skip" -c 1 -o "$out/$name" "$bin/moe_bench" "${P[@]}" "$@"
  ncu -i "$out/$name.ncu-rep" --print-details all >"$out/$name.details.txt" 2>&1
  ncu -i "$out/$name.ncu-rep" --page source --csv --print-source sass 2>&1 | gzip >"$out/$name.sass.csv.gz"
  rm -f "$out/$name.ncu-rep"
}
prof mv1_g1 TileKernel 0 --quant int4_group --shapes mixtral --tokens 1 --route matvec
prof dec16_g1 QuantDecodeKernel 0 --quant int4_group --shapes mixtral --tokens 16 --route decode
gpu_check_finish
