# Build: 95ebd45 (moe_bench_old), 46f3fee before its route change and with the int4 matvec
# at 3 CTAs an SM (moe_bench) and at 2 (moe_bench_mv1); moe_quant_gpu_test of the same build.
export LD_LIBRARY_PATH=$PWD/.dist/lib NCCL_NVLS_ENABLE=0
B=.dist/bin; L=$OUT
timeout 200 $B/moe_quant_gpu_test > $L/test_default.log 2>&1; echo "default rc $?"; grep -E "^\[  (PASSED|FAILED) |FAILED" $L/test_default.log | head
F='--gtest_filter=*Routes*:*Tails*:*IntWeightOnly*:*Mixtral*'
for m in rows k; do KPLAN_MOE_QUANT_DECODE_SPLIT=$m timeout 150 $B/moe_quant_gpu_test $F > $L/test_$m.log 2>&1; echo "$m rc $?"; grep -E "^\[  (PASSED|FAILED) |FAILED" $L/test_$m.log | head -5; done
timeout 150 compute-sanitizer --tool memcheck $B/moe_quant_gpu_test --gtest_filter=*MatvecRoute*:*SmallShapesTails* > $L/memcheck.log 2>&1; echo "memcheck rc $?"; grep -E "ERROR SUMMARY|PASSED|FAILED" $L/memcheck.log | head -4
A="--budget_s 0.3 --warmup_s 1 --check_tokens 2"
for v in old mv1 new; do b=$B/moe_bench; [ $v != new ] && b=$B/moe_bench_$v
  timeout 120 $b $A --shapes qwen3,mixtral,deepseek --quant int4_group --tokens 1,16,64 --json $L/int4_$v.json > $L/int4_$v.log 2>&1; echo "$v int4 rc $?"
  timeout 60 $b $A --shapes mixtral --quant fp8_block,int8_group,int4_group/fp32s --tokens 1,16 --json $L/other_$v.json > $L/other_$v.log 2>&1; echo "$v other rc $?"
done
for v in old mv1 new; do echo "== $v"; grep -hE "^(Qwen3|Mixtral|DeepSeek)" $L/int4_$v.log $L/other_$v.log | grep -v "ws  " | awk '{print $1,$2,$3,$4,$5,$6,$9}'; done
timeout 90 $B/moe_bench $A --shapes mixtral,qwen3,deepseek --quant int4_group --tokens 64,128,256 --route decode,auto --json $L/route_new.json > $L/route_new.log 2>&1; echo "route rc $?"
grep -hE "^(Qwen3|Mixtral|DeepSeek)" $L/route_new.log | grep -v "ws  " | awk '{print $1,$2,$3,$4,$5,$6,$9}'
