"""The Python client against a real kplan-server started on a free port."""
import os
import re
import subprocess
import time
import unittest

from kplan_client import Client, KplanError
import grpc


class PythonClientTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = subprocess.Popen(
            [os.environ["KPLAN_SERVER_BIN"], "--listen=127.0.0.1:0"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        port = None
        deadline = time.time() + 20
        while port is None and time.time() < deadline:
            line = cls.server.stdout.readline()
            m = re.search(r"\(port (\d+)\)", line)
            if m:
                port = m.group(1)
        if port is None:
            cls.server.kill()
            raise RuntimeError("kplan-server did not start")
        cls.client = Client(f"127.0.0.1:{port}", timeout=10)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.server.terminate()
        cls.server.wait(timeout=30)

    def test_health(self):
        self.assertTrue(self.client.health())
        self.assertTrue(self.client.health("kplan.v1.KernelPlanService"))

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
        import numpy as np

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

        # numpy reference: softmax, top-k, renormalise, SiLU-and-mul, weighted sum.
        p = np.exp(logits - logits.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        ref = np.zeros((m, h), np.float64)
        for t in range(m):
            top = np.argsort(-p[t], kind="stable")[:k]
            for ex in top:
                g = w13[ex, :i] @ x[t]
                u = w13[ex, i:] @ x[t]
                y = w2[ex] @ (g / (1 + np.exp(-g)) * u)
                ref[t] += p[t, ex] / p[t, top].sum() * y
        np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)

        bf16 = self.client.run_moe("py-layer", x, logits, top_k=k, dtype="bfloat16")
        self.assertEqual(bf16.dtype, np.float32)
        self.assertLess(np.abs(bf16 - ref).max(), 0.05 * np.abs(ref).max() + 1e-2)
        self.assertEqual(self.client.unload_experts("py-layer"), info.bytes)
        with self.assertRaises(KplanError) as ctx:
            self.client.run_moe("py-layer", x, logits, top_k=k)
        self.assertEqual(ctx.exception.code, grpc.StatusCode.NOT_FOUND)

    def test_info(self):
        info = self.client.info()
        self.assertTrue(info.version)
        self.assertGreater(info.limits.max_message_bytes, 0)


if __name__ == "__main__":
    unittest.main()
