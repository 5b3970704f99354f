# Build: 46f3fee (moe_bench, moe_quant_gpu_test); moe_bench_knob = 46f3fee with
# KPLAN_KNOB_B16 (MoeQuantDecodeBlockFor's limit for blocks of 16, avg2 <= 20 when unset).
export LD_LIBRARY_PATH=$PWD/.dist/lib NCCL_NVLS_ENABLE=0
B=.dist/bin; L=$OUT/logs; mkdir -p $L
s=$(date +%s); timeout 200 $B/moe_quant_gpu_test > $L/test_default.log 2>&1; echo "tests rc $? $(( $(date +%s)-s )) s"; grep -E "^\[  (PASSED|FAILED) |FAILED" $L/test_default.log | head -8
A="--budget_s 0.3 --warmup_s 0.5 --check_tokens 2"
row() { grep -hE "^(Qwen3|Mixtral|DeepSeek)" "$@" | grep -v "ws  " | awk '{print $1,$2,$3,$4,$5,$6,$9}'; }
timeout 120 $B/moe_bench $A --shapes qwen3,mixtral,deepseek --quant int4_group --tokens 1,2,16,64,128,256 --json $L/int4.json > $L/int4.log 2>&1; echo "== int4 rc $?"; row $L/int4.log
timeout 60 $B/moe_bench $A --shapes mixtral --quant fp8_block,int8_group,int4_group/fp32s --tokens 1,16 --json $L/other.json > $L/other.log 2>&1; echo "== other rc $?"; row $L/other.log
for k in 20 40; do KPLAN_KNOB_B16=$k timeout 50 $B/moe_bench_knob $A --shapes mixtral --quant int4_group --tokens 48,64,80 > $L/b16m_$k.log 2>&1; KPLAN_KNOB_B16=$k timeout 40 $B/moe_bench_knob $A --shapes qwen3 --quant int4_group --tokens 192,256 > $L/b16q_$k.log 2>&1; echo "== b16 $k"; row $L/b16m_$k.log $L/b16q_$k.log; done
timeout 90 ncu --clock-control none --set full --import-source yes -k regex:QuantDecodeKernel -c 1 -o $L/mix16 $B/moe_bench --budget_s 0.01 --sets 1 --warmup_s 0 --check_tokens 0 --quant int4_group --shapes mixtral --tokens 16 --route decode > $L/ncu_run.log 2>&1; echo "ncu rc $?"
ncu -i $L/mix16.ncu-rep --print-details all > $L/mix16.details.txt 2>&1; ncu -i $L/mix16.ncu-rep --page source --csv --print-source sass > $L/mix16.sass.csv 2>&1; rm -f $L/mix16.ncu-rep
grep -E "Duration|DRAM Throughput|Issued Warp Per Scheduler|Stall (Wait|Long|Not Sel|Math|No Inst|Branch|Short)|Registers Per Thread|Achieved Occupancy" $L/mix16.details.txt | head -16
tar -czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
