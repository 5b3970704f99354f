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

    def test_info(self):
        info = self.client.info()
        self.assertTrue(info.version)
        self.assertGreater(info.limits.max_message_bytes, 0)


if __name__ == "__main__":
    unittest.main()
