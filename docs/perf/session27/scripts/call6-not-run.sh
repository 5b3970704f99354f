# Prepared for the swapped-operand-buffers patch (../swapped-operand-buffers.patch on 968e30a);
# not run: no device was lent after call 5.
export LD_LIBRARY_PATH=$PWD/.dist/lib NCCL_NVLS_ENABLE=0
B=.dist/bin; L=$OUT
timeout 60 $B/moe_quant_gpu_test --gtest_filter='*Mixtral8x7B*:*DecodeAndDequantRoutes*:*SmallShapesTails*:*MatvecRoute*' > $L/tests.log 2>&1; echo "tests rc $?"; grep -E "^\[  (PASSED|FAILED) |FAILED|       OK" $L/tests.log | head -8
A="--budget_s 0.25 --warmup_s 0.3 --check_tokens 1 --shapes qwen3,mixtral --quant int4_group --tokens 1,16,64"
row() { grep -hE "^(Qwen3|Mixtral|DeepSeek)" "$@" | grep -v "ws  " | awk '{print $1,$4,$6,$9}'; }
timeout 30 $B/moe_bench $A > $L/new.log 2>&1; echo "== new"; row $L/new.log
timeout 30 $B/moe_bench_c5 $A > $L/c5.log 2>&1; echo "== c5"; row $L/c5.log
