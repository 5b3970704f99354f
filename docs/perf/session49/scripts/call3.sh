#!/usr/bin/env bash
# Session 49, call 3: why 8% fewer instructions a step (call 1, SASS) did
# not make the int4 decode tiles faster. ncu (raw page: every metric of the
# sections, the warp stall breakdown of WarpStateStats included) of the
# layer's two decode GEMMs on s49c at Qwen3-30B-A3B 16 tokens (GEMM 1 k-split,
# GEMM 2 in rows, blocks of 8),
# then DeepSeek-V3 16 tokens with 16-byte and 32-byte chunks
# (KPLAN_EXP_DECODE_CHUNKS=2, 47% slower in call 2).
# Device tool: carry ["build-pack"]; DEADLINE=<limit - 15> OUT=$OUT bash this.
set -uo pipefail
. scripts/gpu-steps.sh
gpu_call_setup kplan-s49c3 s49c
step_keep='QuantDecodeKernel|stalled_(long_scoreboard|lg_throttle|mio_throttle|short_scoreboard|wait|barrier|math_pipe_throttle|not_selected|selected|no_instruction|dispatch_stall|tex_throttle|branch_resolving)_per_issue_active|warps_active.avg.pct|issue_active.avg.pct|dram__throughput.avg.pct_of_peak_sustained_elapsed|lts__t_sectors.avg.pct|l1tex__throughput.avg.pct|gpu__time_duration.sum|l1tex__t_sector_hit_rate.pct|lts__t_sector_hit_rate.pct'
nc=(ncu --clock-control none --set none --section SpeedOfLight --section MemoryWorkloadAnalysis
  --section WarpStateStats --section Occupancy --section SchedulerStats --page raw
  -k regex:QuantDecodeKernel -c 2)
bench=(--budget_s 0.01 --sets 1 --warmup_s 0 --check_tokens 0 --quant int4_group --route decode)
for c in qwen3:16; do
  s=${c%%:*} t=${c##*:}
  left 60 && TAIL=80 step "ncu_${s}_$t" 90 "${nc[@]}" .t_s49c/bin/moe_bench "${bench[@]}" \
    --shapes "$s" --tokens "$t"
done
for ch in 1 2; do
  left 60 && KPLAN_EXP_DECODE_CHUNKS=$ch TAIL=80 step "ncu_deepseek_16_c$ch" 90 "${nc[@]}" \
    .t_s49c/bin/moe_bench "${bench[@]}" --shapes deepseek --tokens 16
done
gpu_check_finish
