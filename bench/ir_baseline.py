#!/usr/bin/env python3
"""PyTorch baseline for bench/ir_bench: rms_norm and fused add + rms_norm on
bf16 [16384, 8192] and [64, 8192], timed the same way (about 3 s of warm-up,
CUDA events around batches of launches, median over batches, inputs rotating
over enough sets to exceed 4x L2, random data) next to an SM copy measured in
the same run, printing the same table columns as ir_bench.

    python3 bench/ir_baseline.py [--warmup_s 3] [--samples 50] [--copy_mib 1024]

rms_norm is torch.nn.functional.rms_norm(x, (H,), weight, eps); fused add is
y = x + res followed by rms_norm(y) (two kernels, as eager PyTorch runs it);
the copy roofline is torch.neg(src, out=dst), an elementwise SM kernel that
reads and writes every byte once (copy_ may use the copy engines instead).
"""
import argparse
import statistics
import time

import torch
import torch.nn.functional as F


def median_ms(fn, samples, batch):
    start = torch.cuda.Event(enable_timing=True)
    stop = torch.cuda.Event(enable_timing=True)
    for i in range(batch):  # untimed warm batch
        fn(i)
    times = []
    k = 0
    for _ in range(samples):
        start.record()
        for _ in range(batch):
            fn(k)
            k += 1
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) / batch)
    return statistics.median(times)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--warmup_s", type=float, default=3.0)
    p.add_argument("--samples", type=int, default=50)
    p.add_argument("--copy_mib", type=int, default=1024)
    args = p.parse_args()

    dev = torch.device("cuda", 0)
    props = torch.cuda.get_device_properties(dev)
    l2 = getattr(props, "L2_cache_size", 60 * 1024 * 1024)
    print(f"device: {props.name}, {props.multi_processor_count} SMs, L2 {l2 / 1e6:.0f} MB, "
          f"torch {torch.__version__}")

    copy_bytes = args.copy_mib << 20
    src = (torch.rand(copy_bytes // 2, device=dev, dtype=torch.float32) * 4 - 2).to(torch.bfloat16)
    dst = torch.empty_like(src)

    def copy(_):
        torch.neg(src, out=dst)

    t0 = time.time()
    n = 0
    while time.time() - t0 < args.warmup_s:
        for _ in range(20):
            copy(0)
        torch.cuda.synchronize()
        n += 20
    print(f"warm-up: {n} copies of {args.copy_mib} MiB in {args.warmup_s:.1f} s")
    copy_ms = median_ms(copy, args.samples, 10)
    copy_gbps = 2.0 * copy_bytes / (copy_ms * 1e-3) / 1e9
    del src, dst

    rows = []
    hidden = 8192
    eps = 1e-6
    for tokens in (16384, 64):
        nbytes = tokens * hidden * 2
        sets = max(1, (4 * l2) // (4 * nbytes) + 1)
        gen = torch.Generator(device=dev).manual_seed(1234)
        xs = [torch.rand(tokens, hidden, device=dev, generator=gen).mul_(4).sub_(2).to(torch.bfloat16)
              for _ in range(sets)]
        rs = [torch.rand(tokens, hidden, device=dev, generator=gen).mul_(4).sub_(2).to(torch.bfloat16)
              for _ in range(sets)]
        w = torch.rand(hidden, device=dev, generator=gen).mul_(4).sub_(2).to(torch.bfloat16)
        shape = f"[{tokens}, {hidden}]"
        batch = 5 if tokens >= 4096 else 100

        def rms(i):
            F.rms_norm(xs[i % sets], (hidden,), w, eps)

        def fused(i):
            y = xs[i % sets] + rs[i % sets]
            F.rms_norm(y, (hidden,), w, eps)

        rms_bytes = 2.0 * nbytes + hidden * 2
        fused_bytes = 4.0 * nbytes + hidden * 2
        for op, fn, b in (("rms_norm", rms, rms_bytes), ("fused_add_rms_norm", fused, fused_bytes)):
            ms = median_ms(fn, args.samples, batch)
            rows.append((op, shape, "torch", ms * 1e3, b / (ms * 1e-3) / 1e9))
        del xs, rs
        torch.cuda.empty_cache()

    print(f"\nSM copy roofline: {args.copy_mib} MiB, {copy_ms * 1e3:.1f} us, {copy_gbps:.0f} GB/s "
          "(read + written)\n")
    print(f"{'op':<20} {'shape':<14} {'dtype':<5} {'provider':<8} {'time_us':>10} {'GB/s':>10} "
          f"{'copy_GB/s':>10} {'%copy':>8}")
    for op, shape, prov, us, gbps in rows:
        print(f"{op:<20} {shape:<14} {'bf16':<5} {prov:<8} {us:10.2f} {gbps:10.0f} "
              f"{copy_gbps:10.0f} {100 * gbps / copy_gbps:7.1f}%")


if __name__ == "__main__":
    main()
