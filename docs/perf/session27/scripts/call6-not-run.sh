# The next device call for this work (not run in session 27: no machine lent after call 5).
# Here: the base build (HEAD, a904d7a or later) as .dist, its moe_bench kept as the A/B's old
# side, then the swapped-operand-buffers patch built into .dist:
#   ninja -C build moe_bench moe_quant_gpu_test && cp build/bin/moe_bench /tmp/moe_bench_old
#   git apply docs/perf/session27/swapped-operand-buffers.patch
#   ninja -C build moe_bench moe_quant_gpu_test
#   rm -rf .dist && bash scripts/bundle.sh .dist build/bin/{moe_quant_gpu_test,moe_bench} /tmp/moe_bench_old
#   strip --strip-debug .dist/bin/* .dist/lib/*
# There (one call, about 590 s of steps): the suites, memcheck and racecheck over the decode
# tiles and the matvec, the A/B at 1, 2, 16, 48 and 64 tokens (Qwen3 and Mixtral).
OLD_BENCH=.dist/bin/moe_bench_old TOKENS=1,2,16,48,64 scripts/quant-decode-gpu-check.sh .dist
