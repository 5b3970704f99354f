#!/usr/bin/env bash
# Session 34, device call 1: where the time goes, before changing anything.
# Binaries: docs/perf/session33/scripts/pack.sh NAME TARGETS... (s34: b69ce58's
# moe_bench; s34b: ring-operands.patch, moe_bench moe_quant_gpu_test; s34c,
# s34d: the aligned order, moe_bench and the GPU suites of call3.sh /
# call4.sh; s34e: call5.sh's order of the loads). The profiles' reports were
# reduced to docs/perf/session34/call1/logs/*.summary.txt.
# - moe_bench int4_group at 1 / 16 / 64 tokens on the three shapes (the
#   baseline of this card) and the bf16 Mixtral-8x7B 1024 / 4096 rows.
# - ncu --set full with SASS source counters, one kernel a profile:
#   the int4 matvec (Mixtral-8x7B one token, GEMM 1 and GEMM 2), the int4
#   decode tiles (Mixtral 16 tokens, GEMM 1), and the bf16 warp-specialised
#   fused GEMM 1 and GEMM 2 at Mixtral 1024 and 4096 tokens.
# Each profile leaves NAME.details.txt and NAME.sass.csv.gz in the logs.
set -uo pipefail
tar -xJf build-pack/s34.tar.xz
. scripts/gpu-steps.sh
gpu_check_setup kplan-s34 .tdist
echo "binaries of $(cat .tdist/REV)"
step_keep='FAIL|rooflines|^(Mixtral|Qwen3|DeepSeek)|^ +[0-9]+ +[0-9.]+ |Duration|DRAM Throughput|Compute \(SM\)|Issue Slots Busy|Executed Ipc A|L2 Hit|Registers Per|Achieved Occ'
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv,noheader
B=(--budget_s 0.3 --sets 2 --fused on --warmup_s 0.5 --check_tokens 2 --route auto)
TAIL=30 step int4 150 "$bin/moe_bench" "${B[@]}" --quant int4_group --shapes qwen3,mixtral,deepseek \
  --tokens 1,16,64 --json "$out/int4.json"
TAIL=10 step bf16 90 "$bin/moe_bench" "${B[@]}" --quant bf16 --shapes mixtral --tokens 1024,4096 \
  --json "$out/bf16.json"
P=(--budget_s 0.01 --sets 1 --warmup_s 0 --check_tokens 0)
prof() {  # name kernel-regex skip bench-args...
  local name=$1 k=$2 skip=$3
  shift 3
  TAIL=12 step "ncu_$name" 120 ncu --clock-control none --set full --import-source yes \
    -k "regex:$k" --launch-skip "$skip" -c 1 -o "$out/$name" "$bin/moe_bench" "${P[@]}" "$@"
  ncu -i "$out/$name.ncu-rep" --print-details all >"$out/$name.details.txt" 2>&1
  ncu -i "$out/$name.ncu-rep" --page source --csv --print-source sass 2>&1 | gzip >"$out/$name.sass.csv.gz"
  rm -f "$out/$name.ncu-rep"
}
prof mv1_g1 TileKernel 0 --quant int4_group --shapes mixtral --tokens 1 --route matvec
prof mv1_g2 TileKernel 1 --quant int4_group --shapes mixtral --tokens 1 --route matvec
prof dec16_g1 QuantDecodeKernel 0 --quant int4_group --shapes mixtral --tokens 16 --route decode
prof ws1024_g1 WsGrouped 0 --quant bf16 --shapes mixtral --tokens 1024 --fused on
prof ws1024_g2 WsGrouped 1 --quant bf16 --shapes mixtral --tokens 1024 --fused on
prof ws4096_g1 WsGrouped 0 --quant bf16 --shapes mixtral --tokens 4096 --fused on
prof ws4096_g2 WsGrouped 1 --quant bf16 --shapes mixtral --tokens 4096 --fused on
gpu_check_finish
