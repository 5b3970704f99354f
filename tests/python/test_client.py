"""The kplan Python package against real kplan-servers (a plain one on a free
port, one on a Unix socket, one with mutual TLS and a token), started here.
KPLAN_SERVER_BIN names the server; KPLAN_TEST_CERTS_SCRIPT the script that
makes a throwaway PKI (tests/rpc/make_test_certs.sh)."""
import json
import math
import os
import re
import statistics
import struct
import subprocess
import tempfile
import threading
import time
import unittest

import grpc
import numpy as np

import kplan
from kplan import Client, KplanError
from kplan.v1 import service_pb2


def start_server(*flags):
    """A kplan-server with `flags`; returns (process, port or None)."""
    proc = subprocess.Popen([os.environ["KPLAN_SERVER_BIN"], "--exit_timeout=5s", *flags],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 20
    while time.time() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        m = re.search(r"\(port (\d+)", line)
        if m or "listening on unix:" in line:
            # Keep reading its log so that the server never blocks on a full pipe.
            proc.drain = threading.Thread(target=proc.stdout.read, daemon=True)
            proc.drain.start()
            return proc, m.group(1) if m else None
    proc.kill()
    raise RuntimeError("kplan-server did not start")


def stop_server(proc):
    proc.terminate()
    proc.wait(timeout=30)
    proc.drain.join(timeout=5)  # EOF once the server has exited
    proc.stdout.close()


def write_safetensors(path, tensors):
    """A safetensors file of {name: float32 or float16 array}."""
    header, blobs, offset = {}, [], 0
    for name, a in tensors.items():
        data = np.ascontiguousarray(a).tobytes()
        header[name] = {"dtype": {np.float32: "F32", np.float16: "F16"}[a.dtype.type],
                        "shape": list(a.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def moe_reference(x, logits, w13, w2, k):
    """softmax, top-k, renormalise, SiLU-and-mul, weighted sum (float64)."""
    i = w2.shape[2]
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    ref = np.zeros((x.shape[0], w2.shape[1]), np.float64)
    for t in range(x.shape[0]):
        top = np.argsort(-p[t], kind="stable")[:k]
        for ex in top:
            g = w13[ex, :i] @ x[t]
            u = w13[ex, i:] @ x[t]
            y = w2[ex] @ (g / (1 + np.exp(-g)) * u)
            ref[t] += p[t, ex] / p[t, top].sum() * y
    return ref


class PythonClientTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.server, port = start_server("--listen=127.0.0.1:0")
        cls.client = Client(f"127.0.0.1:{port}", timeout=30)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        stop_server(cls.server)
        cls.tmp.cleanup()

    def test_the_installed_package(self):
        self.assertTrue(os.path.exists(os.path.join(os.path.dirname(kplan.__file__), "py.typed")))
        if os.environ.get("KPLAN_EXPECT_INSTALLED"):
            self.assertIn("site-packages", kplan.__file__)

    def test_health(self):
        self.assertTrue(self.client.health())
        self.assertTrue(self.client.health("kplan.v1.KernelPlanService"))
        # A name longer than 127 bytes (the old hand-encoded request broke there):
        # the server parses it and does not know it.
        with self.assertRaises(KplanError) as ctx:
            self.client.health("x" * 200)
        self.assertEqual(ctx.exception.code, grpc.StatusCode.NOT_FOUND)

    def test_resolve_binds_passthrough(self):
        r = self.client.resolve(moe_backend="flashinfer-moe-ep-cutedsl", platform="cuda:10.0",
                                ir_op_priority={"rms_norm": "native, vllm_c"})
        self.assertEqual(r.kernel_config.moe_backend, "flashinfer_moe_ep_cutedsl")
        self.assertEqual(r.parallel.all2all_backend, "passthrough")
        self.assertEqual(list(r.kernel_config.ir_op_priority.rms_norm), ["native", "vllm_c"])
        self.assertRegex(r.config_hash, "^[0-9a-f]{64}$")

    def test_error_names_the_field(self):
        with self.assertRaises(KplanError) as ctx:
            self.client.resolve(moe_backend="warp_drive")
        self.assertEqual(ctx.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
        self.assertEqual(ctx.exception.field, "kernel_config.moe_backend")
        self.assertIn("Input should be 'auto'", ctx.exception.message)

    def test_load_run_unload(self):
        rng = np.random.default_rng()
        e, k, h, i, m = 4, 2, 32, 16, 6
        w13 = rng.normal(0, 0.2, (e, 2 * i, h)).astype(np.float32)
        w2 = rng.normal(0, 0.2, (e, h, i)).astype(np.float32)
        info = self.client.load_experts("py-layer", w13, w2, chunk_bytes=1000)
        self.assertEqual(info.bytes, w13.nbytes + w2.nbytes)
        self.assertIn("py-layer", [x.experts_id for x in self.client.list_experts()])
        x = rng.normal(0, 1, (m, h)).astype(np.float32)
        logits = rng.normal(0, 1, (m, e)).astype(np.float32)
        out, resp = self.client.run_moe("py-layer", x, logits, top_k=k, return_plan=True)
        self.assertEqual(resp.plan.backend, "emulation")
        self.assertEqual(resp.timing.coalesced_requests, 0)  # the test server does not coalesce
        ref = moe_reference(x, logits, w13, w2, k)
        np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)
        self.assertTrue(out.flags.writeable)
        out[0, 0] = 1.0  # writable: no copy needed to use it

        bf16 = self.client.run_moe("py-layer", x, logits, top_k=k, dtype="bfloat16")
        self.assertEqual(bf16.dtype, np.float32)
        self.assertTrue(bf16.flags.writeable)
        self.assertLess(np.abs(bf16 - ref).max(), 0.05 * np.abs(ref).max() + 1e-2)
        self.assertEqual(self.client.unload_experts("py-layer"), info.bytes)
        with self.assertRaises(KplanError) as ctx:
            self.client.run_moe("py-layer", x, logits, top_k=k)
        self.assertEqual(ctx.exception.code, grpc.StatusCode.NOT_FOUND)

    def test_a_load_deadline_grows_with_its_size(self):
        # A client whose calls get 1 ms still loads: a load's default deadline is
        # 60 s plus 1 s per 100 MB, not the per-call timeout; an explicit one rules.
        rng = np.random.default_rng()
        w13 = rng.normal(0, 0.2, (4, 64, 32)).astype(np.float32)
        w2 = rng.normal(0, 0.2, (4, 32, 32)).astype(np.float32)
        with Client(self.client._target, timeout=0.001,
                    max_message_bytes=kplan.DEFAULT_MAX_MESSAGE_BYTES) as hasty:
            with self.assertRaises(KplanError) as ctx:
                hasty.load_experts("py-deadline", w13, w2, chunk_bytes=1000, timeout=0.001)
            self.assertEqual(ctx.exception.code, grpc.StatusCode.DEADLINE_EXCEEDED)
            # Another id: the expired load's may still be held while it is dropped.
            info = hasty.load_experts("py-deadline-2", w13, w2, chunk_bytes=1000)
        self.assertEqual(info.bytes, w13.nbytes + w2.nbytes)
        self.client.unload_experts("py-deadline-2")
        big = service_pb2.ExpertsHeader(num_experts=128, hidden_size=7168,
                                        intermediate_size=2048, activation="silu")
        small = service_pb2.ExpertsHeader(num_experts=8, hidden_size=256,
                                          intermediate_size=512, activation="silu")
        self.assertGreater(kplan.client.load_timeout(big), kplan.client.load_timeout(small) + 50)

    def test_load_progress_is_reported(self):
        # 96 MiB in 1 MiB chunks, polled every 5 ms: the callback sees it mid-way,
        # as the server counts it, and so does another client.
        e, h, i = 16, 1024, 512
        w13 = np.full((e, 2 * i, h), 0.01, np.float32)
        w2 = np.full((e, h, i), 0.02, np.float32)
        other = Client(self.client._target, timeout=30)
        seen, listed = [], []

        def on_progress(info):
            seen.append((info.state, info.progress.bytes_done, info.progress.bytes_total,
                         info.progress.experts_done, info.progress.experts_total))
            if not listed:
                listed.extend(x for x in other.list_experts() if x.experts_id == "py-progress")

        self.client.progress_interval = 0.005
        try:
            info = self.client.load_experts("py-progress", w13, w2, chunk_bytes=1 << 20,
                                            progress=on_progress)
        finally:
            del self.client.progress_interval
        total = w13.nbytes + w2.nbytes
        self.assertTrue(seen, "no progress was reported")
        self.assertTrue(all(s[0] == service_pb2.EXPERTS_STATE_LOADING for s in seen))
        self.assertTrue(any(0 < s[1] < total for s in seen), seen)
        self.assertTrue(all(s[2] == total and s[4] == e and 0 <= s[3] <= e for s in seen), seen)
        self.assertEqual([s[1] for s in seen], sorted(s[1] for s in seen))  # never backwards
        self.assertEqual(len(listed), 1)
        self.assertEqual(listed[0].state, service_pb2.EXPERTS_STATE_LOADING)
        self.assertEqual(info.state, service_pb2.EXPERTS_STATE_READY)
        ready = [x for x in other.list_experts() if x.experts_id == "py-progress"]
        self.assertEqual([x.state for x in ready], [service_pb2.EXPERTS_STATE_READY])
        other.close()
        self.client.unload_experts("py-progress")

    def test_load_on_the_server(self):
        # A file the server reads under its --model_root: the same layer as numpy's.
        rng = np.random.default_rng(4)
        e, k, h, i = 4, 2, 32, 16
        w13 = rng.normal(0, 0.2, (e, 2 * i, h)).astype(np.float32)
        w2 = rng.normal(0, 0.2, (e, h, i)).astype(np.float32)
        write_safetensors(os.path.join(self.tmp.name, "onserver.safetensors"),
                          {"l.w13": w13, "l.w2": w2})
        server, port = start_server("--listen=127.0.0.1:0", f"--model_root={self.tmp.name}")
        try:
            with Client(f"127.0.0.1:{port}", timeout=30) as c:
                info = c.load_experts_on_server("srv", "onserver.safetensors", e, h, i,
                                                dtype="float32", w13="l.w13", w2="l.w2",
                                                progress=lambda info: None)
                self.assertEqual(info.state, service_pb2.EXPERTS_STATE_READY)
                self.assertEqual(info.bytes, w13.nbytes + w2.nbytes)
                x = rng.normal(0, 1, (3, h)).astype(np.float32)
                logits = rng.normal(0, 1, (3, e)).astype(np.float32)
                np.testing.assert_allclose(c.run_moe("srv", x, logits, top_k=k),
                                           moe_reference(x, logits, w13, w2, k),
                                           rtol=1e-4, atol=1e-4)
                with self.assertRaises(KplanError) as ctx:
                    c.load_experts_on_server("far", "/etc/passwd", e, h, i, w13="a", w2="b")
                self.assertEqual(ctx.exception.code, grpc.StatusCode.PERMISSION_DENIED)
                self.assertEqual(ctx.exception.field, "header.safetensors.path")
        finally:
            stop_server(server)

    def test_replies_over_4_mib(self):
        # 1024 x 1024 float32 out: 4 MiB + framing, past gRPC's default limit.
        e, h, i, m = 2, 1024, 8, 1024
        rng = np.random.default_rng(1)
        w13 = rng.normal(0, 0.05, (e, 2 * i, h)).astype(np.float32)
        w2 = rng.normal(0, 0.05, (e, h, i)).astype(np.float32)
        self.client.load_experts("py-wide", w13, w2)
        try:
            x = rng.normal(0, 1, (m, h)).astype(np.float32)
            logits = rng.normal(0, 1, (m, e)).astype(np.float32)
            out, resp = self.client.run_moe("py-wide", x, logits, top_k=1, return_plan=True)
            self.assertEqual(out.shape, (m, h))
            self.assertGreater(resp.ByteSize(), 4 << 20)
            self.assertEqual(self.client.max_message_bytes,
                             self.client.info().limits.max_message_bytes)
            rows = [0, 511, 1023]
            np.testing.assert_allclose(out[rows], moe_reference(x[rows], logits[rows], w13, w2, 1),
                                       rtol=1e-4, atol=1e-4)
        finally:
            self.client.unload_experts("py-wide")

    def test_run_ir_op(self):
        rng = np.random.default_rng(2)
        x = rng.normal(0, 1, (3, 37)).astype(np.float32)
        w = rng.uniform(0.5, 1.5, 37).astype(np.float32)
        out = self.client.run_ir_op("rms_norm", {"x": x, "weight": w}, epsilon=1e-6)
        self.assertEqual(self.client.last_ir_provider, "native")
        ref = x / np.sqrt((x.astype(np.float64) ** 2).mean(1, keepdims=True) + 1e-6) * w
        np.testing.assert_allclose(out["out"], ref, rtol=1e-5, atol=1e-5)
        self.assertTrue(out["out"].flags.writeable)
        with self.assertRaises(KplanError) as ctx:
            self.client.run_ir_op("rms_norm", {"x": x, "weight": w[:5]}, epsilon=1e-6)
        self.assertEqual(ctx.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
        self.assertTrue(ctx.exception.field)

    def test_gelu_and_mul_sparse_takes_the_std_multiplier(self):
        rng = np.random.default_rng(4)
        x = rng.normal(0, 1, (2, 16)).astype(np.float32)
        mult = statistics.NormalDist().inv_cdf(0.9)
        out = self.client.run_ir_op("gelu_and_mul_sparse", {"x": x}, std_multiplier=mult)
        gate, up = x[:, :8].astype(np.float64), x[:, 8:].astype(np.float64)
        cutoff = gate.mean(1, keepdims=True) + gate.std(1, keepdims=True) * mult
        g = np.maximum(gate - cutoff, 0.0)
        erf = np.vectorize(math.erf)
        ref = 0.5 * g * (1.0 + erf(g / math.sqrt(2.0))) * up
        np.testing.assert_allclose(out["out"], ref, rtol=1e-5, atol=1e-5)
        self.assertGreater(np.count_nonzero(out["out"]), 0)

    def test_load_from_safetensors_stacked_and_per_expert(self):
        rng = np.random.default_rng(3)
        e, h, i, m, k = 3, 16, 8, 5, 2
        w13 = rng.normal(0, 0.2, (e, 2 * i, h)).astype(np.float32)
        w2 = rng.normal(0, 0.2, (e, h, i)).astype(np.float32)
        stacked = os.path.join(self.tmp.name, "stacked.safetensors")
        write_safetensors(stacked, {"l0.w13": w13, "l0.w2": w2})
        per_expert = os.path.join(self.tmp.name, "experts.safetensors")
        tensors = {}
        for ex in range(e):
            tensors[f"mlp.experts.{ex}.gate_proj.weight"] = w13[ex, :i]
            tensors[f"mlp.experts.{ex}.up_proj.weight"] = w13[ex, i:]
            tensors[f"mlp.experts.{ex}.down_proj.weight"] = w2[ex]
        write_safetensors(per_expert, tensors)
        x = rng.normal(0, 1, (m, h)).astype(np.float32)
        logits = rng.normal(0, 1, (m, e)).astype(np.float32)
        ref = moe_reference(x, logits, w13, w2, k)
        for experts_id, kwargs, path in (
                ("py-st", {"w13": "l0.w13", "w2": "l0.w2"}, stacked),
                ("py-st-e", {"template": "mlp.experts.{e}.{proj}.weight"}, per_expert)):
            info = self.client.load_experts_safetensors(experts_id, path, chunk_bytes=100,
                                                        **kwargs)
            self.assertEqual((info.num_experts, info.hidden_size, info.intermediate_size),
                             (e, h, i))
            out = self.client.run_moe(experts_id, x, logits, top_k=k)
            np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4, err_msg=experts_id)
            self.client.unload_experts(experts_id)
        with self.assertRaises(ValueError):
            self.client.load_experts_safetensors("py-bad", stacked, w13="nope", w2="l0.w2")

    def test_retries_unavailable_then_fails(self):
        # Nothing listens here: UNAVAILABLE, retried with backoff, then raised.
        with socket_port() as port:
            c = Client(f"127.0.0.1:{port}", timeout=5, retries=2, backoff=0.05)
            start = time.monotonic()
            with self.assertRaises(KplanError) as ctx:
                c.info()
            self.assertEqual(ctx.exception.code, grpc.StatusCode.UNAVAILABLE)
            self.assertGreater(time.monotonic() - start, 0.05 * 0.5 * 3)  # two backoffs
            self.assertIn(f"no kplan-server answered at 127.0.0.1:{port} over plaintext",
                          ctx.exception.message)
            c.close()


class socket_port:
    """A free TCP port on 127.0.0.1 that nothing listens on."""

    def __enter__(self):
        import socket
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        self.port = s.getsockname()[1]
        s.close()
        return self.port

    def __exit__(self, *exc):
        pass


class RetryTest(unittest.TestCase):
    def test_a_server_that_starts_late_is_reached(self):
        sock = os.path.join(tempfile.mkdtemp(), "late.sock")
        started = {}

        def start_later():
            time.sleep(0.5)
            started["proc"], _ = start_server(f"--listen=unix:{sock}")

        t = threading.Thread(target=start_later)
        t.start()
        try:
            c = Client(f"unix:{sock}", timeout=20, retries=8, backoff=0.2)
            self.assertTrue(c.info().version)
            c.close()
        finally:
            t.join()
            stop_server(started["proc"])


class SharedMemoryTest(unittest.TestCase):
    """kplan.shm against a CPU-path server with --allow_shared_memory on a
    Unix socket: the output through a region equals the inline run's."""

    def test_run_moe_by_reference(self):
        tmp = tempfile.mkdtemp()
        proc, _ = start_server(f"--listen=unix:{tmp}/shm.sock", "--devices=none",
                               "--allow_shared_memory")
        try:
            c = Client(f"unix:{tmp}/shm.sock", timeout=30)
            rng = np.random.default_rng()
            e, k, h, i, m = 4, 2, 32, 16, 5
            w13 = rng.normal(0, 0.2, (e, 2 * i, h)).astype(np.float32)
            w2 = rng.normal(0, 0.2, (e, h, i)).astype(np.float32)
            c.load_experts("shm-layer", w13, w2)
            x = rng.normal(0, 1, (m, h)).astype(np.float32)
            logits = rng.normal(0, 1, (m, e)).astype(np.float32)
            want = c.run_moe("shm-layer", x, logits, top_k=k)
            with c.shared_memory(64 << 10) as region:
                key = region.key
                self.assertEqual(os.stat("/dev/shm" + key).st_mode & 0o777, 0o600)
                self.assertEqual([r.name for r in c.list_shared_memory()], [region.name])
                sx = region.array((m, h))
                sl = region.array((m, e))
                out = region.array((m, h))
                sx.array[:] = x
                sl.array[:] = logits
                out.array[:] = np.nan
                got, resp = c.run_moe("shm-layer", sx, sl, top_k=k, output=out,
                                      return_plan=True)
                self.assertIs(got, out.array)
                self.assertEqual(resp.output.shm.region, region.name)
                self.assertEqual(len(resp.output.data), 0)
                np.testing.assert_array_equal(got, want)
                self.assertTrue(got.flags.writeable)
                # A mixed call: inline hidden states, logits by reference.
                np.testing.assert_array_equal(c.run_moe("shm-layer", x, sl, top_k=k), want)
                # A reference past the region names its field.
                bad = kplan.shm.ShmTensor(region, region.byte_size - 8, sx.array, sx.dtype)
                with self.assertRaises(KplanError) as ctx:
                    c.run_moe("shm-layer", bad, sl, top_k=k)
                self.assertEqual(ctx.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
                self.assertEqual(ctx.exception.field, "hidden_states.shm.byte_size")
                with self.assertRaises(ValueError):
                    region.array((1 << 20,))
            self.assertEqual(c.list_shared_memory(), [])
            self.assertFalse(os.path.exists("/dev/shm" + key))
            c.close()
        finally:
            stop_server(proc)

    def test_run_moe_through_a_channel(self):
        """kplan.shm_channel: the same bytes as gRPC's run_moe, errors with
        their code and field, a closed channel says UNAVAILABLE, and nothing
        is left in /dev/shm."""
        tmp = tempfile.mkdtemp()
        proc, _ = start_server(f"--listen=unix:{tmp}/ch.sock", "--devices=none",
                               "--allow_shared_memory")
        try:
            c = Client(f"unix:{tmp}/ch.sock", timeout=30)
            rng = np.random.default_rng()
            e, k, h, i = 8, 2, 32, 16
            w13 = rng.normal(0, 0.2, (e, 2 * i, h)).astype(np.float32)
            w2 = rng.normal(0, 0.2, (e, h, i)).astype(np.float32)
            c.load_experts("ch-layer", w13, w2)
            # The state word moves by compare-and-swap (libatomic), not by
            # the plain stores of the fallback.
            self.assertIsNotNone(kplan.shm_channel._atomic_cas)
            with c.shm_channel(mode=0o660) as ch:
                name = ch.name
                self.assertEqual(os.stat("/dev/shm/" + name).st_mode & 0o777, 0o660)
                for m in (1, 7, 1, 40):
                    x = rng.normal(0, 1, (m, h)).astype(np.float32)
                    logits = rng.normal(0, 1, (m, e)).astype(np.float32)
                    want = c.run_moe("ch-layer", x, logits, top_k=k)
                    got = c.run_moe("ch-layer", x, logits, top_k=k, channel=ch)
                    np.testing.assert_array_equal(got, want)
                    np.testing.assert_allclose(got, moe_reference(x, logits, w13, w2, k),
                                               rtol=1e-4, atol=1e-5)
                with self.assertRaises(KplanError) as ctx:
                    c.run_moe("nope", x, logits, top_k=k, channel=ch)
                self.assertEqual(ctx.exception.code, grpc.StatusCode.NOT_FOUND)
                self.assertEqual(ctx.exception.field, "experts_id")
                with self.assertRaises(KplanError) as ctx:
                    c.run_moe("ch-layer", x, logits, top_k=e + 1, channel=ch)
                self.assertEqual(ctx.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
                self.assertIsNotNone(ctx.exception.field)
                np.testing.assert_array_equal(
                    c.run_moe("ch-layer", x, logits, top_k=k, channel=ch), want)
                # Tensors in the channel's region (always / never / too
                # tight for it: the output needs room too): the same bytes.
                with c.shm_channel(in_region_from=0) as always, \
                        c.shm_channel(in_region_from=-1) as never, \
                        c.shm_channel(request_capacity=96 << 10, in_region_from=0) as tight:
                    for m in (600, 1, 0, 33):
                        x2 = rng.normal(0, 1, (m, h)).astype(np.float32)
                        logits2 = rng.normal(0, 1, (m, e)).astype(np.float32)
                        want2 = c.run_moe("ch-layer", x2, logits2, top_k=k)
                        for channel in (always, never, tight):
                            np.testing.assert_array_equal(
                                c.run_moe("ch-layer", x2, logits2, top_k=k, channel=channel),
                                want2)
                        sent = always._get(kplan.shm_channel._REQ_BYTES)
                        if m > 0:
                            self.assertLess(sent, 256, m)
                        # 600 tokens do not fit 96 KiB with their output: serialized.
                        sent = tight._get(kplan.shm_channel._REQ_BYTES)
                        if m == 600:
                            self.assertGreater(sent, 600 * h * 4, m)
                        elif m > 0:
                            self.assertLess(sent, 256, m)
                c.close_shm_channel(ch.name)
                with self.assertRaises(KplanError) as ctx:
                    c.run_moe("ch-layer", x, logits, top_k=k, channel=ch)
                self.assertEqual(ctx.exception.code, grpc.StatusCode.UNAVAILABLE)
            self.assertFalse(os.path.exists("/dev/shm/" + name))
            self.assertEqual(c.list_shared_memory(), [])
            c.close()
        finally:
            stop_server(proc)

    def test_a_server_without_shared_memory_refuses_and_nothing_is_left(self):
        proc, port = start_server("--listen=127.0.0.1:0", "--devices=none")
        try:
            c = Client(f"127.0.0.1:{port}", timeout=30)
            with self.assertRaises(KplanError) as ctx:
                c.shared_memory(4096)
            self.assertEqual(ctx.exception.code, grpc.StatusCode.FAILED_PRECONDITION)
            c.close()
        finally:
            stop_server(proc)
        self.assertFalse([f for f in os.listdir("/dev/shm")
                          if f.startswith(f"kplan-py-{os.getpid()}-")])


@unittest.skipUnless(os.environ.get("KPLAN_TEST_CERTS_SCRIPT"), "no cert script")
class TlsTest(unittest.TestCase):
    def test_mutual_tls_and_token(self):
        with tempfile.TemporaryDirectory() as d:
            subprocess.run(["bash", os.environ["KPLAN_TEST_CERTS_SCRIPT"], d], check=True,
                           stdout=subprocess.DEVNULL)
            with open(os.path.join(d, "token")) as f:
                token = f.read().strip()
            proc, port = start_server(
                "--listen=127.0.0.1:0", f"--tls_cert={d}/server.pem", f"--tls_key={d}/server.key",
                f"--tls_client_ca={d}/ca.pem", f"--auth_token_file={d}/token")
            try:
                target = f"localhost:{port}"
                tls = dict(root_certificates=f"{d}/ca.pem", certificate_chain=f"{d}/client.pem",
                           private_key=f"{d}/client.key")
                with Client(target, token=token, **tls) as c:
                    self.assertTrue(c.health())
                    self.assertTrue(c.info().version)
                    w = np.ones((1, 4, 4), np.float32)
                    c.load_experts("tls-layer", w, np.ones((1, 4, 2), np.float32))
                    self.assertEqual([x.experts_id for x in c.list_experts()], ["tls-layer"])
                with Client(target, token="wrong", **tls) as c:
                    with self.assertRaises(KplanError) as ctx:
                        c.info()
                    self.assertEqual(ctx.exception.code, grpc.StatusCode.UNAUTHENTICATED)
                with Client(target, token=token, root_certificates=f"{d}/ca.pem",
                            retries=0) as c:  # no client certificate
                    with self.assertRaises(KplanError) as ctx:
                        c.info()
                    self.assertIn(f"no kplan-server answered at {target} over TLS",
                                  ctx.exception.message)
                with Client(target, token=token, retries=0, timeout=2) as c:  # plaintext
                    with self.assertRaises(KplanError) as ctx:
                        c.info()
                    self.assertEqual(ctx.exception.code, grpc.StatusCode.UNAVAILABLE)
                    self.assertIn("over plaintext (is it running there? one serving TLS needs "
                                  "root_certificates=)", ctx.exception.message)
            finally:
                stop_server(proc)


if __name__ == "__main__":
    unittest.main()
