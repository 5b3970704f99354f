"""RunMoE with tensors in this process's CUDA memory through the Python client
(kplan.cuda_ipc), checked on a GPU host by hand; not a ctest (CI has no GPU).
The counterpart of tests/rpc/gpu_ipc_test.cc, through torch and the client.

It starts a GPU kplan-server (--devices=0 --allow_shared_memory) and a
CPU-path one (--devices=none), loads the same bf16 experts on both, puts
inputs in one torch CUDA buffer, registers it by the handle that
kplan.cuda_ipc.handle_of_torch gives, and runs run_moe with hidden states,
router logits (or a given top-k) and the output in that buffer: the output
must equal the inline GPU run's bit for bit and the CPU path's within the
layer tolerance of tests/testing/tolerance.h (as gpu_ipc_test.cc), on fresh
random data (seed printed; KPLAN_IPC_TEST_SEED repeats one). Then the
server's errors with a real handle.

Needs, on the GPU host:
  - a kplan-server built with CUDA, named by $KPLAN_SERVER_BIN;
  - a python3 with torch (CUDA), numpy, grpcio and protobuf (the client's
    dependencies), and client/python on PYTHONPATH.
Skips (prints SKIP, exits 0) when grpcio, protobuf, torch or a CUDA device is
missing; exits 1 on a failed check, 0 with PASS.

  KPLAN_SERVER_BIN=build/bin/kplan-server PYTHONPATH=client/python \\
      python3 tests/python/gpu_cuda_ipc_check.py

On a lent H200 (the `run` tool runs over /work/main's tree: this file must be
merged there first), with a server from a CUDA build (KPLAN_CUDA=ON):
  bash scripts/bundle.sh /work/main/.dist/ipc build/bin/kplan-server
  strip --strip-debug /work/main/.dist/ipc/bin/*
then `run` with carry [".dist/ipc"] and the command
  export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
  KPLAN_SERVER_BIN=$PWD/.dist/ipc/bin/kplan-server PYTHONPATH=client/python \\
      python3 tests/python/gpu_cuda_ipc_check.py
(bundle.sh gives the server an $ORIGIN rpath to its libraries: no
LD_LIBRARY_PATH, which would hand the bundled libssl and others to python3
and torch too).
The image's python3 holds torch; /work/.library/device/KINDS.md lists grpcio
and protobuf among its packages too. Where they are missing the check prints
SKIP: carry them as wheels (.whl, /work/.library/device/README.md's Notes)
and install them first as that README says.
"""
import os
import sys
import tempfile


def skip(why):
    print(f"SKIP gpu_cuda_ipc_check: {why}")
    sys.exit(0)


try:
    import google.protobuf
    import grpc
    del google.protobuf  # only: is the client's other dependency there
except ImportError as e:
    skip(f"{e} (the kplan client needs grpcio and protobuf)")
try:
    import torch
except ImportError:
    skip("torch is not importable")
if not torch.cuda.is_available():
    skip("torch sees no CUDA device")
if not os.environ.get("KPLAN_SERVER_BIN"):
    sys.exit("gpu_cuda_ipc_check: set KPLAN_SERVER_BIN to a kplan-server built with CUDA")

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kplan import Client, KplanError, cuda_ipc  # noqa: E402
from kplan._tensors import to_bfloat16_bits  # noqa: E402
from test_client import start_server, stop_server  # noqa: E402

E, H, I, K = 8, 512, 256, 2
MAX_M = 300


def bf16_values(rng, shape, scale):
    """Random float32 values that bfloat16 holds exactly."""
    bits = to_bfloat16_bits(rng.normal(0, scale, shape).astype(np.float32))
    return (bits.astype(np.uint32) << 16).view(np.float32)


def bf16_bits(values):
    """The bfloat16 bit patterns of float32 values bfloat16 holds (run_moe's
    bfloat16 outputs, widened)."""
    return (np.ascontiguousarray(values, np.float32).view(np.uint32) >> 16).astype(np.uint16)


def expect_near_cpu(got, ref, what):
    """tests/testing/tolerance.h MoeLayerElementTolerance: |g - r| <=
    |r| * 2^-7 + rms(r) * 2^-5, element by element."""
    rms = float(np.sqrt(np.mean(np.square(ref, dtype=np.float64))))
    assert rms > 0, f"{what}: the CPU reference is all zeros"
    bound = np.abs(ref) * 2.0 ** -7 + rms * 2.0 ** -5
    excess = np.abs(got.astype(np.float64) - ref) / bound
    bad = np.argwhere(excess > 1)
    assert bad.size == 0, (f"{what}: {len(bad)} elements off the CPU reference, first "
                           f"{[(tuple(i), got[tuple(i)], ref[tuple(i)]) for i in bad[:5]]}")
    return float(excess.max())


def expect_error(code, field, call):
    try:
        call()
    except KplanError as e:
        assert (e.code, e.field) == (code, field), f"expected {code} on {field}, got {e}"
        print(f"  refused as expected: {e}")
        return
    raise AssertionError(f"expected {code} on {field}, the call succeeded")


def main():
    seed = int(os.environ.get("KPLAN_IPC_TEST_SEED") or np.random.SeedSequence().entropy % 2**32)
    print(f"seed {seed} (KPLAN_IPC_TEST_SEED), torch {torch.__version__}, "
          f"{torch.cuda.get_device_name(0)}")
    rng = np.random.default_rng(seed)
    tmp = tempfile.mkdtemp()
    gpu_proc, _ = start_server(f"--listen=unix:{tmp}/gpu.sock", "--devices=0",
                               "--allow_shared_memory")
    cpu_proc, _ = start_server(f"--listen=unix:{tmp}/cpu.sock", "--devices=none",
                               "--allow_shared_memory")
    try:
        gpu = Client(f"unix:{tmp}/gpu.sock", timeout=120)
        cpu = Client(f"unix:{tmp}/cpu.sock", timeout=120)
        w13 = bf16_values(rng, (E, 2 * I, H), 0.06)
        w2 = bf16_values(rng, (E, H, I), 0.06)
        for c in (gpu, cpu):
            c.load_experts("ipc", w13, w2, dtype="bfloat16")
        check(gpu, cpu, rng)
        gpu.close()
        cpu.close()
    finally:
        stop_server(gpu_proc)
        stop_server(cpu_proc)
    print("PASS gpu_cuda_ipc_check")


def check(gpu, cpu, rng):
    # Another tensor first: torch's allocator likely carves both from one
    # segment, the buffer then not at its start (base > 0).
    first = torch.empty(2 << 20, dtype=torch.uint8, device="cuda:0")
    buf = torch.empty(2 << 20, dtype=torch.uint8, device="cuda:0")
    handle, size, device, base = cuda_ipc.handle_of_torch(buf)
    print(f"buffer: region {size} bytes on cuda:{device}, the buffer at {base}; the tensor "
          f"before it shares its handle: {cuda_ipc.handle_of_torch(first)[0] == handle}")
    assert device == 0 and size >= base + buf.numel(), (size, base)

    def view(at, n, dtype, shape):
        return buf[at - base:at - base + n].view(dtype).view(*shape)

    # The server's errors with a real handle, before it is registered.
    expect_error(grpc.StatusCode.INVALID_ARGUMENT, "region.byte_size",
                 lambda: gpu.register_cuda_memory(handle, 1 << 40, device))
    expect_error(grpc.StatusCode.FAILED_PRECONDITION, "region.device_id",
                 lambda: gpu.register_cuda_memory(handle, size, torch.cuda.device_count()))
    expect_error(grpc.StatusCode.FAILED_PRECONDITION, "region.cuda_ipc_handle",
                 lambda: cpu.register_cuda_memory(handle, size, device))

    region = gpu.register_cuda_memory(handle, size, device, name="torch-buf")
    listed = [(r.name, r.device_id, r.byte_size, r.cuda_ipc_handle)
              for r in gpu.list_shared_memory()]
    assert listed == [("torch-buf", 0, size, b"")], listed
    expect_error(grpc.StatusCode.ALREADY_EXISTS, "region.cuda_ipc_handle",
                 lambda: gpu.register_cuda_memory(handle, size, device, name="again"))

    for m in (1, 37, MAX_M):
        x = bf16_values(rng, (m, H), 1.0)
        logits = rng.normal(0, 1, (m, E)).astype(np.float32)
        x_ref = region.tensor((m, H), "bfloat16", offset=base)
        l_ref = region.tensor((m, E), "float32", offset=base + x_ref.byte_size + 4)  # unaligned
        o_ref = region.tensor((m, H), "bfloat16", offset=base + (1 << 20) + 128)
        view(x_ref.offset, x_ref.byte_size, torch.bfloat16, (m, H)).copy_(torch.from_numpy(x))
        view(l_ref.offset, l_ref.byte_size, torch.float32, (m, E)).copy_(
            torch.from_numpy(logits))
        view(o_ref.offset, o_ref.byte_size, torch.uint8, (-1,)).fill_(0xFF)  # NaNs
        torch.cuda.synchronize()  # the server reads on its own stream

        inline, inline_resp = gpu.run_moe("ipc", x, logits, top_k=K, dtype="bfloat16",
                                          return_plan=True)
        got, resp = gpu.run_moe("ipc", x_ref, l_ref, top_k=K, output=o_ref, return_plan=True)
        assert got is o_ref, "an output in CUDA memory comes back as its reference"
        assert not resp.output.data and resp.output.shm.region == "torch-buf", resp.output
        out = view(o_ref.offset, o_ref.byte_size, torch.bfloat16, (m, H))
        out_bits = out.view(torch.int16).cpu().numpy().view(np.uint16)
        np.testing.assert_array_equal(out_bits, bf16_bits(inline),
                                      err_msg=f"{m} tokens: CUDA IPC vs inline")
        ref = cpu.run_moe("ipc", x, logits, top_k=K, dtype="bfloat16")
        worst = expect_near_cpu(out.float().cpu().numpy(), ref, f"{m} tokens")
        print(f"  {m} tokens: bit-equal to the inline run ({inline_resp.plan.backend}, "
              f"{inline_resp.plan.experts_kernel}); worst error {worst:.3f} of the tolerance")

        # A given top-k in CUDA memory, the output in the response.
        ids = np.stack([rng.permutation(E)[:K] for _ in range(m)]).astype(np.int32)
        weights = rng.uniform(0.1, 1, (m, K)).astype(np.float32)
        i_ref = region.tensor((m, K), "int32", offset=base + (1 << 19))
        w_ref = region.tensor((m, K), "float32", offset=i_ref.offset + i_ref.byte_size)
        view(i_ref.offset, i_ref.byte_size, torch.int32, (m, K)).copy_(torch.from_numpy(ids))
        view(w_ref.offset, w_ref.byte_size, torch.float32, (m, K)).copy_(
            torch.from_numpy(weights))
        torch.cuda.synchronize()
        given = gpu.run_moe("ipc", x_ref, topk_ids=i_ref, topk_weights=w_ref)
        want = gpu.run_moe("ipc", x, topk_ids=ids, topk_weights=weights, dtype="bfloat16")
        np.testing.assert_array_equal(bf16_bits(given), bf16_bits(want),
                                      err_msg=f"{m} tokens, given top-k")

    # Tensors carved from the buffer: the same handle, their own offsets.
    part = buf[4096:8192].view(torch.float32)
    assert cuda_ipc.handle_of_torch(part) == (handle, size, device, base + 4096)
    region.unregister()
    assert gpu.list_shared_memory() == []
    expect_error(grpc.StatusCode.NOT_FOUND, "hidden_states.shm.region",
                 lambda: gpu.run_moe("ipc", x_ref, l_ref, top_k=K))
    del first


if __name__ == "__main__":
    main()
