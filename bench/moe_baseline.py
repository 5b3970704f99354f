#!/usr/bin/env python3
"""Baselines for bench/moe_bench: a bf16 MoE layer built on torch._grouped_mm
(--impl grouped_mm, the default) or on a vLLM-style fused MoE in Triton with
vLLM's H200 configs (--impl triton, bench/moe_triton.py: what vLLM itself runs
for an unquantised MoE on this GPU), or an fp8 layer on
torch._scaled_grouped_mm (--impl fp8_grouped_mm, #17's torch fp8 baseline:
e4m3 weights with a scale per output channel, quantised once at setup;
activations quantised per token (row) in the layer before each GEMM; fast
accumulation, as torchao's fp8 MoE runs it; moe_bench's nearest rows are
--quant fp8_per_channel and fp8_block), timed the way moe_bench times the kplan
layer, printing the same table columns next to a copy and a matmul roofline
measured in the same run.

    python3 bench/moe_baseline.py [--impl grouped_mm|triton|fp8_grouped_mm]
        [--shapes mixtral,qwen3,deepseek] [--tokens 1,16,64,256,1024,4096]
        [--replays 200] [--sets 8] [--budget_s 1.5] [--warmup_s 3]
        [--copy_mib 1024]

The layer (routing through combine), all on the device, no host sync:
  softmax(logits fp32) -> torch.topk(k) -> renormalise (vLLM fused_topk,
  renormalize=True); slots sorted by expert (stable argsort), per-expert
  counts (scatter_add) -> int32 cumulative offsets; gather of the token rows;
  torch._grouped_mm(x_sorted, w13^T, offs) [M*k, 2I]; silu(gate) * up;
  torch._grouped_mm(a, w2^T, offs) [M*k, H]; weighted scatter-add (index_add_
  in fp32) into [M, H], rounded to bf16.
Weights w13 [E, 2I, H] and w2 [E, H, I] (gate rows first), as kplan stores
them; _grouped_mm takes mat_b [E, K, N], given as the transposed views
(column-major in the last two dims, which it accepts). The Triton layer takes
them as they are (its docstring has the steps); where it tries several
configs (a shape vLLM has no H200 table for) each one's kernels are timed
eagerly on set 0 and the fastest is kept, its name in the row's note. Column
kern_us (Triton only): the same layer with routing and align done outside
the graph, i.e. the GEMMs, activation and sum alone. vLLM's layer adds its
routing and align kernels to that (not measured here).

Method (as moe_bench): weights random bf16 (randn / sqrt(fan-in)), once per
shape; a pool of R random logit [M, E] / hidden [M, H] sets; one CUDA graph
holding R layers, layer s reading set s (fresh routing per layer); if the
capture fails the layer is timed eagerly and the row says so. Checks before
timing: once, the layer against a per-token loop in fp32 on a small random
shape and on Qwen3-30B-A3B; per config, up to 4 tokens of set 0 against the
loop, and the graph's output against the eager one. ~3 s of bf16 GEMMs
before anything is timed, 1 s after each shape's setup, 0.2 s of replays per
config; CUDA events around batches of replays (>= ~2 ms each), median,
divided by R. Experts hit: distinct ids in each set's routing, averaged over
the R sets; weight bytes = hit * 3 * I * H * 2 (* 1 for fp8); FLOPs = 6 * M * k
* H * I. The fp8 layer is checked against the same bf16-weight loop within
0.15 (per-row e4m3 weights and activations through two GEMMs: 5-7% in a
simulation of these data; a wrong layout or scale gives O(1)); the others
within 1e-2; the graph against the eager layer within 1e-2 for all.
Rooflines: torch.neg over 1 GiB bf16 (bytes read + written) and torch.mm
bf16 8192^3; floor = max(bytes / copy, FLOPs / matmul).
"""
import argparse
import csv
import json
import statistics
import time

import torch
import torch.nn.functional as F

SHAPES = {
    "mixtral": ("Mixtral-8x7B", 8, 2, 4096, 14336),
    "qwen3": ("Qwen3-30B-A3B", 128, 8, 2048, 768),
    "deepseek": ("DeepSeek-V3", 256, 8, 7168, 2048),
}


def median_ms(fn, samples, batch):
    start = torch.cuda.Event(enable_timing=True)
    stop = torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(samples):
        start.record()
        for _ in range(batch):
            fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) / batch)
    return statistics.median(times)


def busy(fn, seconds):
    t0 = time.time()
    n = 0
    while time.time() - t0 < seconds:
        for _ in range(10):
            fn()
        torch.cuda.synchronize()
        n += 10
    return n


def route(logits, k):
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
    topw, topi = torch.topk(probs, k, dim=-1)
    topw = topw / topw.sum(dim=-1, keepdim=True)
    return topw, topi


def sort_slots(logits, k, E):
    """Routing and the slots sorted by expert: (topi, tok: the token of each
    sorted slot, offs: int32 cumulative slot counts per expert, ws: each
    sorted slot's routing weight)."""
    topw, topi = route(logits, k)
    flat = topi.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.zeros(E, dtype=torch.int32, device=logits.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat, dtype=torch.int32))
    offs = torch.cumsum(counts, 0, dtype=torch.int32)
    return topi, order // k, offs, topw.reshape(-1).index_select(0, order)


def combine(ys, tok, ws, M):
    """The weighted sum of the sorted slots' outputs ys per token, in fp32."""
    out = torch.zeros(M, ys.shape[1], dtype=torch.float32, device=ys.device)
    out.index_add_(0, tok, ys.float() * ws[:, None])
    return out.to(torch.bfloat16)


def moe_layer(x, logits, w13_t, w2_t, k):
    """x [M, H] bf16, logits [M, E] fp32, w13_t [E, H, 2I], w2_t [E, I, H]."""
    I = w2_t.shape[1]
    topi, tok, offs, ws = sort_slots(logits, k, w13_t.shape[0])
    xs = x.index_select(0, tok)
    h = torch._grouped_mm(xs, w13_t, offs=offs)
    a = F.silu(h[:, :I]) * h[:, I:]
    ys = torch._grouped_mm(a, w2_t, offs=offs)
    return combine(ys, tok, ws, x.shape[0]), topi


FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0


def quant_rows(t):
    """t [..., C] to e4m3 with one fp32 scale per row (amax / 448): (q, scale)."""
    s = t.abs().amax(dim=-1, keepdim=True).float().clamp_min(1e-12) / FP8_MAX
    return (t.float() / s).to(FP8), s.squeeze(-1)


def fp8_weights(w):
    """w [E, N, K] bf16 -> e4m3 [E, N, K] and scales [E, N], an expert at a
    time (an fp32 copy of DeepSeek-V3's w13 would take 30 GB)."""
    q = torch.empty(w.shape, dtype=FP8, device=w.device)
    s = torch.empty(w.shape[:2], dtype=torch.float32, device=w.device)
    for e in range(w.shape[0]):
        q[e], s[e] = quant_rows(w[e])
    return q, s


def moe_layer_fp8(x, logits, q13, s13, q2, s2, k):
    """moe_layer on torch._scaled_grouped_mm: q13 [E, 2I, H] / q2 [E, H, I]
    e4m3 with per-row scales s13 [E, 2I] / s2 [E, H]; each GEMM's A
    quantised per row right before it."""
    I = q2.shape[2]
    _, tok, offs, ws = sort_slots(logits, k, q13.shape[0])
    xq, xs = quant_rows(x.index_select(0, tok))
    h = torch._scaled_grouped_mm(xq, q13.transpose(-2, -1), xs, s13, offs=offs,
                                 out_dtype=torch.bfloat16, use_fast_accum=True)
    aq, as_ = quant_rows(F.silu(h[:, :I]) * h[:, I:])
    ys = torch._scaled_grouped_mm(aq, q2.transpose(-2, -1), as_, s2, offs=offs,
                                  out_dtype=torch.bfloat16, use_fast_accum=True)
    return combine(ys, tok, ws, x.shape[0])


_FP8_CACHE = {}


def loop_reference(x, logits, w13, w2, k, rows):
    """Per token, per chosen expert, in fp32 from the bf16 values."""
    topw, topi = route(logits[:rows], k)
    I = w2.shape[2]
    out = torch.zeros(rows, x.shape[1], dtype=torch.float32, device=x.device)
    for m in range(rows):
        xm = x[m].float()
        for j in range(k):
            e = int(topi[m, j])
            h = w13[e].float() @ xm
            a = F.silu(h[:I]) * h[I:]
            out[m] += float(topw[m, j]) * (w2[e].float() @ a)
    return out


def rel_err(got, want):
    got = got.float()
    want = want.float()
    if not torch.isfinite(got).all():
        return float("inf")
    return float((got - want).norm() / want.norm().clamp_min(1e-30))


def make_weights(E, H, I, dev, gen):
    w13 = torch.randn(E, 2 * I, H, device=dev, dtype=torch.bfloat16, generator=gen)
    w13.mul_(H ** -0.5)
    w2 = torch.randn(E, H, I, device=dev, dtype=torch.bfloat16, generator=gen)
    w2.mul_(I ** -0.5)
    return w13, w2


def make_inputs(M, E, H, dev, gen):
    x = torch.randn(M, H, device=dev, dtype=torch.bfloat16, generator=gen)
    logits = torch.rand(M, E, device=dev, dtype=torch.float32, generator=gen) * 6 - 3
    return x, logits


def make_layer(impl, w13, w2, k, cfg=None):
    """layer(x, logits) -> [M, H] bf16 for the implementation `impl`."""
    if impl == "grouped_mm":
        w13_t, w2_t = w13.transpose(-2, -1), w2.transpose(-2, -1)
        return lambda x, lg: moe_layer(x, lg, w13_t, w2_t, k)[0]
    if impl == "fp8_grouped_mm":  # the e4m3 copy once per weight set
        key = (w13.data_ptr(), w2.data_ptr(), tuple(w13.shape), tuple(w2.shape))
        if key not in _FP8_CACHE:
            _FP8_CACHE.clear()
            _FP8_CACHE[key] = fp8_weights(w13) + fp8_weights(w2)
        q13, s13, q2, s2 = _FP8_CACHE[key]
        return lambda x, lg: moe_layer_fp8(x, lg, q13, s13, q2, s2, k)
    import moe_triton  # noqa: PLC0415 - only with --impl triton (needs triton)
    cfg = cfg or moe_triton.SMALL
    return lambda x, lg: moe_triton.moe_layer(x, *route(lg, k), w13, w2, cfg)


def check_against_loop(impl, name, x, logits, w13, w2, k, rows):
    try:
        got = make_layer(impl, w13, w2, k)(x, logits)
    except Exception as e:  # noqa: BLE001 - report, the caller stops
        print(f"  check {name}: the layer raised {type(e).__name__}: {e}")
        return False
    want = loop_reference(x, logits, w13, w2, k, rows)
    err = rel_err(got[:rows], want)
    ok = err <= TOL[impl]
    print(f"  check {name}: {rows} tokens vs per-token fp32 loop: rel {err:.1e}"
          f"{'' if ok else '  <-- MISMATCH'}")
    return ok


def pick_layer(impl, E, k, I, M, w13, w2, x0, l0):
    """The layer to time, its config's name and the config: for Triton the
    candidates of moe_triton.candidates, each timed eagerly on set 0, the
    fastest."""
    if impl != "triton":
        return make_layer(impl, w13, w2, k), "", None
    import moe_triton  # noqa: PLC0415
    cands = moe_triton.candidates(E, I, M)
    topw, topi = route(l0, k)
    best = None
    for cfg in cands:
        # The kernels alone (routing and align once, outside the timing).
        al = moe_triton.align(topi, E, cfg["BLOCK_SIZE_M"])

        def run(cfg=cfg, al=al):
            moe_triton.moe_kernels(x0, topw, al, w13, w2, cfg)

        run()  # compile
        ms = median_ms(run, 5, 3) if len(cands) > 1 else 0.0
        if best is None or ms < best[0]:
            best = (ms, cfg)
    cfg = best[1]
    name = "M{BLOCK_SIZE_M} N{BLOCK_SIZE_N} K{BLOCK_SIZE_K} G{GROUP_SIZE_M} " \
           "w{num_warps} s{num_stages}".format(**cfg)
    return make_layer(impl, w13, w2, k, cfg), name, cfg


def capture(fns):
    """The callables fns run once on a side stream (warm-up), then captured
    in one CUDA graph: (graph, what each returned during the capture)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for f in fns:
            f()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        outs = [f() for f in fns]
    return g, outs


def warm_ms(replay):
    """Calls replay for >= 0.2 s (and >= 6 times), three per event pair;
    returns the last pair's ms per call."""
    start = torch.cuda.Event(enable_timing=True)
    stop = torch.cuda.Event(enable_timing=True)
    tw = time.time()
    n = 0
    while time.time() - tw < 0.2 or n < 6:
        start.record()
        for _ in range(3):
            replay()
        stop.record()
        stop.synchronize()
        n += 3
    return max(1e-3, start.elapsed_time(stop) / 3)


def graph_us(fns):
    """us per call of the callables fns, captured in one CUDA graph, warmed
    as the layer is, and replayed in batches of >= ~2 ms (median)."""
    g, _ = capture(fns)
    batch = max(1, int(-(-2.0 // warm_ms(g.replay))))
    return median_ms(g.replay, 15, batch) * 1e3 / len(fns)


def kernels_only_us(x_lg, k, E, w13, w2, cfg):
    """The Triton layer without its routing and align (done once per set
    outside the graph): the part that is vLLM's Triton code."""
    import moe_triton  # noqa: PLC0415
    fns = []
    for x, lg in x_lg:
        topw, topi = route(lg, k)
        al = moe_triton.align(topi, E, cfg["BLOCK_SIZE_M"])
        fns.append(lambda x=x, topw=topw, al=al: moe_triton.moe_kernels(x, topw, al, w13, w2, cfg))
    return graph_us(fns)


def run_config(impl, name, E, k, H, I, M, w13, w2, args, R, copy_gbps, mm_tflops, dev, gen):
    tc = time.time()
    row = dict(shape=name, tokens=M, ok=False, note="")
    pool = [make_inputs(M, E, H, dev, gen) for _ in range(R)]
    # Per-config check: a few tokens of set 0 against the loop.
    x0, l0 = pool[0]
    layer, cfg_name, cfg = pick_layer(impl, E, k, I, M, w13, w2, x0, l0)
    row["config"] = cfg_name
    eager0 = layer(x0, l0)
    rchk = min(M, 4)
    err = rel_err(eager0[:rchk], loop_reference(x0, l0, w13, w2, k, rchk))
    if not err <= TOL[impl]:
        row["note"] = f"CHECK FAILED vs loop: rel {err:.1e}"
        print(f"  {name:14s} M={M:<5d} {row['note']}")
        return row
    hits = [torch.unique(route(lg, k)[1]).numel() for _, lg in pool]
    row["hit"] = sum(hits) / R

    # Capture R layers in one graph (side-stream warm-up first).
    mode = "graph"
    try:
        g, outs = capture([lambda x=x, lg=lg: layer(x, lg) for x, lg in pool])
        g.replay()
        torch.cuda.synchronize()
        gerr = rel_err(outs[0], eager0)
        if not gerr <= 1e-2:
            raise RuntimeError(f"graph output differs from eager: rel {gerr:.1e}")

        def replay():
            g.replay()
    except Exception as e:  # noqa: BLE001 - report and fall back
        mode = "eager"
        print(f"  {name} M={M}: CUDA graph capture failed ({type(e).__name__}: "
              f"{str(e).splitlines()[0] if str(e) else ''}); timing eagerly")
        g = None
        torch.cuda.synchronize()

        def replay():
            for i in range(R):
                layer(pool[i][0], pool[i][1])

    # Warm replays (>= 0.2 s), then batches of >= ~2 ms.
    replay_ms = warm_ms(replay)
    batch = max(1, int(-(-2.0 // replay_ms)))
    samples = min(args.replays, max(5, int(args.budget_s * 1e3 / (batch * replay_ms))))
    ms = median_ms(replay, samples, batch)
    us = ms * 1e3 / R
    wbytes = row["hit"] * 3.0 * I * H * (1.0 if impl == "fp8_grouped_mm" else 2.0)
    flops = 6.0 * M * k * H * I
    t_bytes = wbytes / (copy_gbps * 1e9) * 1e6
    t_flops = flops / (mm_tflops * 1e12) * 1e6
    row.update(ok=True, us=us, gbps=wbytes / (us * 1e-6) / 1e9,
               tflops=flops / (us * 1e-6) / 1e12, floor_us=max(t_bytes, t_flops),
               bound="mm" if t_flops > t_bytes else "copy", mode=mode,
               note=f"{samples} x {batch} replays x {R} layers, {mode}"
               + (f", config {cfg_name}" if cfg_name else ""))
    row["pct_copy"] = 100.0 * row["gbps"] / copy_gbps
    row["pct_mm"] = 100.0 * row["tflops"] / mm_tflops
    if cfg is not None:
        try:
            row["us_kernels"] = kernels_only_us(pool, k, E, w13, w2, cfg)
            row["note"] += f", kernels only {row['us_kernels']:.1f} us"
        except Exception as e:  # noqa: BLE001 - the full layer's row stands
            row["note"] += f", kernels only failed ({type(e).__name__})"
    print(f"  {name:14s} M={M:<5d} {us:10.1f} us  hit {row['hit']:6.1f}  "
          f"{row['gbps']:7.0f} GB/s  {row['tflops']:6.1f} TFLOP/s  "
          f"(check rel {err:.1e}; {row['note']}, {time.time() - tc:.1f} s)", flush=True)
    return row


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--impl", default="grouped_mm", choices=list(SYSTEMS),
                   help="grouped_mm: torch._grouped_mm; triton: vLLM-style fused MoE "
                   "(bench/moe_triton.py) with vLLM's H200 configs; fp8_grouped_mm: "
                   "torch._scaled_grouped_mm, e4m3 per-channel weights, per-token "
                   "activations")
    p.add_argument("--shapes", default="mixtral,qwen3,deepseek")
    p.add_argument("--tokens", default="1,16,64,256,1024,4096")
    p.add_argument("--replays", type=int, default=200, help="most timed batches per config")
    p.add_argument("--sets", type=int, default=8)
    p.add_argument("--budget_s", type=float, default=1.5)
    p.add_argument("--warmup_s", type=float, default=3.0)
    p.add_argument("--copy_mib", type=int, default=1024)
    p.add_argument("--json", help="also write the rows and the rooflines to this file "
                   "(bench/plot_moe.py draws them)")
    p.add_argument("--csv", help="also write the rows to this CSV file")
    args = p.parse_args()
    shapes = [s for s in args.shapes.split(",") if s]
    for s in shapes:
        if s not in SHAPES:
            p.error(f"unknown shape {s!r} ({', '.join(SHAPES)})")
    tokens = [int(t) for t in args.tokens.split(",") if t]
    R = max(1, args.sets)
    t_start = time.time()

    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    props = torch.cuda.get_device_properties(dev)
    print(f"device: {props.name}, {props.multi_processor_count} SMs, torch {torch.__version__}")
    gen = torch.Generator(device=dev).manual_seed(1234)

    # --- Rooflines, after ~warmup_s of GEMMs.
    n = 8192
    ma = torch.randn(n, n, device=dev, dtype=torch.bfloat16, generator=gen)
    mb = torch.randn(n, n, device=dev, dtype=torch.bfloat16, generator=gen)
    mc = torch.empty(n, n, device=dev, dtype=torch.bfloat16)

    def mm():
        torch.mm(ma, mb, out=mc)

    print(f"warm-up: {busy(mm, args.warmup_s)} bf16 8192^3 GEMMs in {args.warmup_s:.1f} s")
    mm_ms = median_ms(mm, 30, 5)
    mm_tflops = 2.0 * n ** 3 / (mm_ms * 1e-3) / 1e12
    print(f"matmul  torch.mm bf16 8192^3: {mm_ms * 1e3:8.1f} us  {mm_tflops:6.1f} TFLOP/s")
    copy_bytes = args.copy_mib << 20
    src = torch.randn(copy_bytes // 2, device=dev, dtype=torch.bfloat16, generator=gen)
    dst = torch.empty_like(src)
    copy_ms = median_ms(lambda: torch.neg(src, out=dst), 30, 10)
    copy_gbps = 2.0 * copy_bytes / (copy_ms * 1e-3) / 1e9
    ok_copy = bool(torch.equal(dst, -src))
    print(f"copy    torch.neg {args.copy_mib} MiB (read + write): {copy_ms * 1e3:8.1f} us  "
          f"{copy_gbps:6.0f} GB/s{'' if ok_copy else '  <-- WRONG OUTPUT'}")
    del src, dst
    print(f"rooflines: copy {copy_gbps:.0f} GB/s, matmul {mm_tflops:.1f} TFLOP/s\n")

    # --- The baseline against the loop, once (a small shape with odd sizes
    # and empty experts, and Qwen3 at 16 tokens).
    all_ok = True
    w13, w2 = make_weights(8, 256, 128, dev, gen)
    x, lg = make_inputs(37, 8, 256, dev, gen)
    all_ok &= check_against_loop(args.impl, "E=8 k=2 H=256 I=128 M=37", x, lg, w13, w2, 2, 37)
    x, lg = make_inputs(3, 8, 256, dev, gen)
    all_ok &= check_against_loop(args.impl, "E=8 k=2 H=256 I=128 M=3", x, lg, w13, w2, 2, 3)
    if args.impl == "triton":  # K not a multiple of BLOCK_SIZE_K, N not of BLOCK_SIZE_N
        w13, w2 = make_weights(8, 200, 104, dev, gen)
        x, lg = make_inputs(37, 8, 200, dev, gen)
        all_ok &= check_against_loop(args.impl, "E=8 k=2 H=200 I=104 M=37", x, lg, w13, w2, 2, 37)
    w13, w2 = make_weights(128, 2048, 768, dev, gen)
    x, lg = make_inputs(16, 128, 2048, dev, gen)
    all_ok &= check_against_loop(args.impl, "Qwen3-30B-A3B M=16", x, lg, w13, w2, 8, 16)
    del w13, w2, x, lg
    if not all_ok:
        print("baseline does not match the loop reference: stopping")
        raise SystemExit(1)

    rows = []
    for key in shapes:
        name, E, k, H, I = SHAPES[key]
        t0 = time.time()
        w13, w2 = make_weights(E, H, I, dev, gen)
        torch.cuda.synchronize()
        gb = (w13.numel() + w2.numel()) * 2 / 1e9
        print(f"{name}: E={E} k={k} H={H} I={I}, weights {gb:.2f} GB (setup {time.time() - t0:.1f} s)")
        busy(mm, 1.0)
        for M in tokens:
            try:
                row = run_config(args.impl, name, E, k, H, I, M, w13, w2, args, R, copy_gbps,
                                 mm_tflops, dev, gen)
            except Exception as e:  # noqa: BLE001 - one config failing must not end the run
                msg = str(e).splitlines()[0] if str(e) else ""
                row = dict(shape=name, tokens=M, ok=False, note=f"{type(e).__name__}: {msg}")
                print(f"  {name:14s} M={M:<5d} FAILED: {row['note']}", flush=True)
                try:
                    torch.cuda.synchronize()
                except Exception:  # noqa: BLE001 - a sticky CUDA error: the next config reports it
                    pass
            rows.append(row)
            torch.cuda.empty_cache()
        del w13, w2
        torch.cuda.empty_cache()

    system = SYSTEMS[args.impl]
    print(f"\nMoE layer on {system} (routing -> combine, {R} routing sets "
          f"rotating, median), {'fp8' if args.impl == 'fp8_grouped_mm' else 'bf16'} silu, "
          "softmax top-k renormalize")
    print(f"rooflines measured in this run: copy {copy_gbps:.0f} GB/s (torch.neg, read + write), "
          f"matmul {mm_tflops:.1f} TFLOP/s (torch.mm bf16 8192^3)")
    print(f"{'shape':14s} {'tokens':>6s} {'us':>11s} {'hit':>7s} {'GB/s':>8s} {'%copy':>7s} "
          f"{'TFLOP/s':>8s} {'%mm':>7s} {'bound':>5s} {'floor_us':>10s} {'%floor':>7s} "
          f"{'kern_us':>8s} mode")
    for r in rows:
        if not r["ok"]:
            print(f"{r['shape']:14s} {r['tokens']:6d}  FAILED: {r['note']}")
            continue
        print(f"{r['shape']:14s} {r['tokens']:6d} {r['us']:11.1f} {r['hit']:7.1f} "
              f"{r['gbps']:8.0f} {r['pct_copy']:6.1f}% {r['tflops']:8.1f} {r['pct_mm']:6.1f}% "
              f"{r['bound']:>5s} {r['floor_us']:10.1f} {100.0 * r['floor_us'] / r['us']:6.1f}% "
              f"{r.get('us_kernels', float('nan')):8.1f} "
              f"{r['mode']}{' ' + r['config'] if r.get('config') else ''}")
    print(f"total {time.time() - t_start:.1f} s")
    write_results(args, system, props.name, copy_gbps, mm_tflops, rows)
    raise SystemExit(0 if all(r["ok"] for r in rows) else 1)


SYSTEMS = {"grouped_mm": "torch._grouped_mm",
           "triton": "vLLM-style Triton fused MoE (H200 configs)",
           "fp8_grouped_mm": "torch._scaled_grouped_mm (fp8 e4m3, per-channel / per-token)"}
# Relative error against the bf16-weight loop (module docstring).
TOL = {"grouped_mm": 1e-2, "triton": 1e-2, "fp8_grouped_mm": 0.15}

CSV_FIELDS = ["shape", "tokens", "ok", "us", "hit", "gbps", "pct_copy", "tflops", "pct_mm",
              "bound", "floor_us", "us_kernels", "config", "note"]


def write_results(args, system, device, copy_gbps, mm_tflops, rows):
    """The same schema as moe_bench --json: {system, device, rooflines, rows}."""
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"system": system, "device": device,
                       "rooflines": {"copy_gbps": copy_gbps, "matmul_tflops": mm_tflops},
                       "rows": rows}, f, indent=1)
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
            w.writeheader()
            w.writerows(rows)


if __name__ == "__main__":
    main()
