# Build: 46f3fee's kernels with a measurement knob, KPLAN_MOE_MATVEC_MIN_WARPS (the int4
# matvec split's warp target; 132*32 when unset), since removed; moe_bench_old = 95ebd45.
export LD_LIBRARY_PATH=$PWD/.dist/lib NCCL_NVLS_ENABLE=0
B=.dist/bin; L=$OUT/logs; mkdir -p $L
s=$(date +%s); timeout 240 $B/moe_quant_gpu_test > $L/test_default.log 2>&1; echo "tests rc $? $(( $(date +%s)-s )) s"; grep -E "^\[  (PASSED|FAILED) |FAILED|OK \]" $L/test_default.log | head -20
A="--budget_s 0.3 --warmup_s 0.5 --check_tokens 2"
row() { grep -hE "^(Qwen3|Mixtral|DeepSeek)" "$@" | grep -v "ws  " | awk '{print $1,$2,$3,$4,$5,$6,$9}'; }
timeout 60 $B/moe_bench_old $A --shapes qwen3,mixtral,deepseek --quant int4_group --tokens 1,2 > $L/mv_old.log 2>&1; echo "== old"; row $L/mv_old.log
for w in 4224 2112 1056; do KPLAN_MOE_MATVEC_MIN_WARPS=$w timeout 60 $B/moe_bench $A --shapes qwen3,mixtral,deepseek --quant int4_group --tokens 1,2 > $L/mv_$w.log 2>&1; echo "== $w"; row $L/mv_$w.log; done
timeout 100 $B/moe_bench $A --shapes qwen3,mixtral,deepseek --quant int4_group --tokens 16,64,128,256 --json $L/auto.json > $L/auto.log 2>&1; echo "== auto"; row $L/auto.log
tar -czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
