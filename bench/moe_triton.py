"""A vLLM-style fused MoE layer in Triton: the baseline that stands for vLLM's
own MoE kernels in bench/moe_baseline.py (--impl triton).

Written for kplan after reading vLLM's fused_moe (vllm/model_executor/layers/
fused_moe/fused_moe.py: fused_moe_kernel, moe_align_block_size, the JSON
configs per device); the code is ours, the algorithm and the tuning data are
vLLM's:

  routing (softmax top-k renormalise, as the other baseline)
  -> align: slots sorted by expert, each expert's run padded to a multiple of
     BLOCK_SIZE_M (padding = the slot count, masked), one expert id per block,
     the padded total in a device scalar (no host sync: graph-capturable)
  -> GEMM 1: one program per (block of BLOCK_SIZE_M slots, BLOCK_SIZE_N
     columns of 2I), GROUP_SIZE_M rasterisation; the block's token rows
     gathered, w13[e] streamed over K in BLOCK_SIZE_K steps, fp32 accumulator,
     stored in bf16 per slot
  -> silu(gate) * up in fp32, rounded to bf16 once
  -> GEMM 2 the same with the routed weight multiplied into the accumulator
  -> the top-k rows of each token summed (fp32 accumulation, bf16 out).

Configs: vLLM's tuned tables for the H200 where it has one for the shape
(below, from vLLM's configs/E=8,N=14336,device_name=NVIDIA_H200.json and
E=128,N=768,device_name=NVIDIA_H200.json), picked as vLLM picks them: the
entry whose token count is nearest M. Where vLLM has no table (DeepSeek-V3 in
bf16) the caller times vLLM's fallback config and a few others (the kernels
alone, eagerly) and keeps the fastest: a small tuning, not vLLM's tuner.

Not vLLM's code: routing and align run here as torch device ops (vLLM: CUDA
kernels, much faster at small batches), SiLU-and-mul is a Triton kernel
rounding once (vLLM: a CUDA kernel, same rounding) and the top-k sum is
torch.sum; K masks are dropped where BLOCK_SIZE_K divides K (vLLM's even_Ks).
"""
import torch
import triton
import triton.language as tl


def _cfg(bm, bn, bk, gm, warps, stages):
    return dict(BLOCK_SIZE_M=bm, BLOCK_SIZE_N=bn, BLOCK_SIZE_K=bk, GROUP_SIZE_M=gm,
                num_warps=warps, num_stages=stages)


# vLLM's H200 tables, keyed by (E, I): tokens -> config.
H200_CONFIGS = {
    (8, 14336): {
        1: _cfg(16, 128, 128, 16, 4, 5), 2: _cfg(32, 64, 128, 1, 4, 5),
        4: _cfg(16, 64, 64, 1, 4, 5), 8: _cfg(16, 128, 128, 1, 4, 5),
        16: _cfg(16, 64, 256, 16, 4, 3), 24: _cfg(16, 128, 256, 16, 4, 2),
        32: _cfg(16, 128, 128, 16, 8, 3), 48: _cfg(32, 128, 128, 16, 4, 3),
        64: _cfg(32, 128, 128, 64, 4, 3), 96: _cfg(32, 128, 128, 64, 4, 3),
        128: _cfg(64, 128, 128, 1, 8, 4), 256: _cfg(128, 256, 64, 1, 8, 4),
        512: _cfg(128, 256, 64, 16, 8, 4), 1024: _cfg(128, 256, 64, 16, 8, 4),
        1536: _cfg(128, 256, 64, 16, 8, 4), 2048: _cfg(128, 256, 64, 32, 8, 4),
        3072: _cfg(128, 256, 64, 16, 8, 4), 4096: _cfg(128, 256, 64, 16, 8, 4),
    },
    (128, 768): {
        1: _cfg(16, 64, 64, 1, 4, 5), 2: _cfg(16, 64, 64, 1, 4, 4),
        4: _cfg(16, 64, 128, 16, 4, 2), 8: _cfg(16, 64, 128, 1, 4, 3),
        16: _cfg(16, 64, 256, 1, 4, 2), 24: _cfg(16, 64, 128, 1, 4, 4),
        32: _cfg(16, 64, 128, 16, 4, 2), 48: _cfg(16, 128, 128, 16, 4, 3),
        64: _cfg(16, 256, 128, 1, 8, 2), 96: _cfg(16, 128, 128, 1, 4, 2),
        128: _cfg(16, 128, 128, 1, 4, 2), 256: _cfg(32, 256, 128, 16, 4, 2),
        512: _cfg(64, 128, 64, 1, 4, 3), 1024: _cfg(128, 256, 64, 16, 8, 4),
        1536: _cfg(128, 256, 64, 1, 8, 4), 2048: _cfg(128, 256, 64, 1, 8, 4),
        3072: _cfg(128, 256, 64, 1, 8, 4), 4096: _cfg(128, 256, 64, 16, 8, 4),
    },
}

# A small config for the checks on toy shapes.
SMALL = _cfg(16, 64, 64, 1, 4, 3)


def nearest(table, M):
    return table[min(table, key=lambda t: abs(t - M))]


def vllm_default(E, M):
    """vLLM's fallback where it has no table (get_default_config, unquantised
    weights); num_warps and num_stages are left to Triton's defaults (4, 3)."""
    if M <= E:
        return _cfg(16, 32, 64, 1, 4, 3)
    return _cfg(64, 64, 32, 8, 4, 3)


def candidates(E, I, M):
    """The configs to try for a shape: vLLM's H200 entry where it has a table,
    else vLLM's fallback, the entries nearest M of both H200 tables and two
    generic ones (the caller keeps the fastest)."""
    if (E, I) in H200_CONFIGS:
        return [nearest(H200_CONFIGS[(E, I)], M)]
    out = [vllm_default(E, M)] + [nearest(t, M) for t in H200_CONFIGS.values()]
    out += [_cfg(16, 64, 128, 1, 4, 3) if M * 8 <= E * 16 else _cfg(64, 128, 64, 8, 4, 3),
            _cfg(128, 256, 64, 16, 8, 4) if M >= 256 else _cfg(32, 128, 128, 16, 4, 3)]
    uniq = []
    for c in out:
        if c not in uniq:
            uniq.append(c)
    return uniq


@triton.jit
def _moe_gemm(a_ptr, b_ptr, c_ptr, w_ptr, sorted_ptr, eid_ptr, post_ptr,
              N, K, EM, num_valid, stride_am, stride_be, stride_bn, stride_cm,
              TOP_K: tl.constexpr, MUL_W: tl.constexpr, EVEN_K: tl.constexpr,
              BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr,
              BLOCK_SIZE_K: tl.constexpr, GROUP_SIZE_M: tl.constexpr):
    """C[slot, n] = sum_k A[slot // TOP_K, k] * B[e, n, k] (x w[slot]) for the
    slots of one block of the aligned order."""
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(EM, BLOCK_SIZE_M)
    num_pid_n = tl.cdiv(N, BLOCK_SIZE_N)
    in_group = GROUP_SIZE_M * num_pid_n
    first_m = (pid // in_group) * GROUP_SIZE_M
    group_m = min(num_pid_m - first_m, GROUP_SIZE_M)
    pid_m = first_m + (pid % in_group) % group_m
    pid_n = (pid % in_group) // group_m
    if pid_m * BLOCK_SIZE_M >= tl.load(post_ptr):
        return
    offs_m = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
    slot = tl.load(sorted_ptr + offs_m)
    live = slot < num_valid
    e = tl.load(eid_ptr + pid_m).to(tl.int64)
    offs_n = (pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)) % N
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    a_ptrs = a_ptr + (slot[:, None] // TOP_K).to(tl.int64) * stride_am + offs_k[None, :]
    b_ptrs = b_ptr + e * stride_be + offs_n[None, :].to(tl.int64) * stride_bn + offs_k[:, None]
    acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    for kk in range(0, tl.cdiv(K, BLOCK_SIZE_K)):
        if EVEN_K:
            a = tl.load(a_ptrs, mask=live[:, None], other=0.0)
            b = tl.load(b_ptrs)
        else:
            kin = offs_k < K - kk * BLOCK_SIZE_K
            a = tl.load(a_ptrs, mask=live[:, None] & kin[None, :], other=0.0)
            b = tl.load(b_ptrs, mask=kin[:, None], other=0.0)
        acc += tl.dot(a, b)
        a_ptrs += BLOCK_SIZE_K
        b_ptrs += BLOCK_SIZE_K
    if MUL_W:
        w = tl.load(w_ptr + slot, mask=live, other=0.0)
        acc = acc * w[:, None]
    offs_cn = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    c_ptrs = c_ptr + slot[:, None].to(tl.int64) * stride_cm + offs_cn[None, :]
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=live[:, None] & (offs_cn[None, :] < N))


@triton.jit
def _silu_mul(h_ptr, out_ptr, I, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = offs < I
    g = tl.load(h_ptr + row * 2 * I + offs, mask=m, other=0.0).to(tl.float32)
    u = tl.load(h_ptr + row * 2 * I + I + offs, mask=m, other=0.0).to(tl.float32)
    y = g / (1.0 + tl.exp(-g)) * u
    tl.store(out_ptr + row * I + offs, y.to(out_ptr.dtype.element_ty), mask=m)


def align(topi, E, bm):
    """vLLM's moe_align_block_size in device ops: (sorted slot ids [EM] with
    padding = numel, the expert of each block, the padded total [1])."""
    dev = topi.device
    flat = topi.reshape(-1).to(torch.int64)
    numel = flat.numel()
    em = numel + E * (bm - 1)
    if numel < E:
        em = min(numel * bm, em)
    blocks = -(-em // bm)
    order = torch.argsort(flat, stable=True)
    counts = torch.zeros(E, dtype=torch.int64, device=dev)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + bm - 1) // bm * bm
    pend = torch.cumsum(padded, 0)
    cstart = torch.cumsum(counts, 0) - counts
    se = flat.index_select(0, order)
    dest = (pend - padded).index_select(0, se) + torch.arange(numel, device=dev) - \
        cstart.index_select(0, se)
    sorted_ids = torch.full((blocks * bm,), numel, dtype=torch.int32, device=dev)
    sorted_ids.scatter_(0, dest, order.to(torch.int32))
    starts = torch.arange(blocks, device=dev, dtype=torch.int64) * bm
    eids = torch.searchsorted(pend, starts, right=True).clamp_max(E - 1).to(torch.int32)
    return sorted_ids, eids, pend[-1:].to(torch.int32), blocks * bm


def _gemm(a, b, c, w, sorted_ids, eids, post, em, num_valid, top_k, cfg):
    E, N, K = b.shape
    grid = (triton.cdiv(em, cfg["BLOCK_SIZE_M"]) * triton.cdiv(N, cfg["BLOCK_SIZE_N"]),)
    _moe_gemm[grid](a, b, c, w if w is not None else c, sorted_ids, eids, post,
                    N, K, em, num_valid, a.stride(0), b.stride(0), b.stride(1), c.stride(0),
                    TOP_K=top_k, MUL_W=w is not None, EVEN_K=K % cfg["BLOCK_SIZE_K"] == 0,
                    BLOCK_SIZE_M=cfg["BLOCK_SIZE_M"], BLOCK_SIZE_N=cfg["BLOCK_SIZE_N"],
                    BLOCK_SIZE_K=cfg["BLOCK_SIZE_K"], GROUP_SIZE_M=cfg["GROUP_SIZE_M"],
                    num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])


def moe_layer(x, topw, topi, w13, w2, cfg):
    """x [M, H] bf16, topw / topi [M, k] (fp32 / int64), w13 [E, 2I, H], w2
    [E, H, I] bf16 -> [M, H] bf16."""
    return moe_kernels(x, topw, align(topi, w2.shape[0], cfg["BLOCK_SIZE_M"]), w13, w2, cfg)


def moe_kernels(x, topw, aligned, w13, w2, cfg):
    """The layer after routing and align (aligned = align(...)): the two GEMMs,
    the activation and the sum, the part vLLM runs in Triton (its routing,
    align and sum are CUDA kernels, faster than the device ops above)."""
    M, H = x.shape
    k = topw.shape[1]
    I = w2.shape[2]
    numel = M * k
    sorted_ids, eids, post, em = aligned
    h = torch.empty(numel, 2 * I, device=x.device, dtype=x.dtype)
    _gemm(x, w13, h, None, sorted_ids, eids, post, em, numel, k, cfg)
    act = torch.empty(numel, I, device=x.device, dtype=x.dtype)
    _silu_mul[(numel, triton.cdiv(I, 1024))](h, act, I, BLOCK=1024)
    y = torch.empty(numel, H, device=x.device, dtype=x.dtype)
    _gemm(act, w2, y, topw.reshape(-1).contiguous(), sorted_ids, eids, post, em, numel, 1, cfg)
    return y.view(M, k, H).sum(dim=1)
