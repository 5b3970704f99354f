#!/bin/bash
# quantdec call 2: decode-kernel checks (both CTA modes), then the benchmark rows
D=.dist/quantdec
export LD_LIBRARY_PATH=$PWD/$D/lib NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv,noheader
T="$D/bin/moe_quant_gpu_test --gtest_filter=*DecodeAndDequant*"
check() {  # $1 label: both CTA modes of the decode kernels
  for m in k rows; do
    KPLAN_MOE_QUANT_DECODE_SPLIT=$m timeout 20 $T > $OUT/t_$1_$m.log 2>&1; r=$?
    echo "test $1 split=$m rc=$r OK-lines=$(grep -cE ' OK$' $OUT/t_$1_$m.log)"; grep -E " FAIL$|FAILED" $OUT/t_$1_$m.log | cut -c1-200 | head -4
    [ $r -eq 0 ] || return 1
  done
}
if ! check async; then export KPLAN_MOE_QUANT_DECODE_PIPE=regs; echo "cp.async ring failed: falling back to PIPE=regs"; check regs; fi
rm -f $OUT/t_*_k.log
B="$D/bin/moe_bench --budget_s 0.2 --sets 4 --fused on"
echo "=== bench deepseek"
timeout 60 $B --shapes deepseek --quant fp8_block,int4_group --tokens 1,16,64,4096 --warmup_s 2 --check_tokens 8 --json $OUT/b_deepseek.json > $OUT/b_deepseek.log 2>&1; echo rc=$?
grep -E "^rooflines|CHECK FAILED|SKIPPED" $OUT/b_deepseek.log | cut -c1-200 | head -8; sed -n '/^kplan GPU MoE layer/,$p' $OUT/b_deepseek.log
echo "=== bench qwen3 mixtral"
timeout 90 $B --shapes qwen3,mixtral --quant int4_group,fp8_block,bf16 --tokens 1,16,64,256,4096 --warmup_s 1 --check_tokens 16 --json $OUT/b_qm.json > $OUT/b_qm.log 2>&1; echo rc=$?
grep -E "^rooflines|CHECK FAILED|SKIPPED" $OUT/b_qm.log | cut -c1-200 | head -8; echo "checks ok: $(grep -cE '^  check.* ok vs CPU' $OUT/b_qm.log)"; sed -n '/^kplan GPU MoE layer/,$p' $OUT/b_qm.log
echo "=== A/B: register prefetch instead of the cp.async ring"
KPLAN_MOE_QUANT_DECODE_PIPE=regs timeout 25 $B --shapes qwen3,mixtral --quant int4_group,fp8_block --tokens 1,64 --warmup_s 1 --check_tokens 8 > $OUT/b_regs.log 2>&1; echo rc=$?
grep -E "CHECK FAILED|SKIPPED" $OUT/b_regs.log | head -4; sed -n '/^kplan GPU MoE layer/,$p' $OUT/b_regs.log | grep -vE "^(kplan|roofl)"
echo "=== other schemes, and the emulation route (before)"
timeout 35 $B --shapes qwen3,mixtral --quant int8_group,fp8_per_tensor,int4_group --route auto,emulation --tokens 1,64 --warmup_s 1 --check_tokens 8 --json $OUT/b_other.json > $OUT/b_other.log 2>&1; echo rc=$?
grep -E "CHECK FAILED|SKIPPED" $OUT/b_other.log | head -4; sed -n '/^kplan GPU MoE layer/,$p' $OUT/b_other.log | grep -vE "^kplan"
