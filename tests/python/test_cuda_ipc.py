"""kplan.cuda_ipc without a GPU: the checks made before any call (each error
names its argument), the messages the client sends (to a stand-in for the
gRPC stub: RegisterSharedMemory with the handle as given, RunMoE with
SharedMemoryRefs for inputs and output_shm, the output returned as its
reference, unregistering once), and a CPU-path kplan-server refusing a CUDA
region with FAILED_PRECONDITION, which the client raises with the server's
message. The GPU path is gpu_cuda_ipc_check.py (run by hand on a GPU host)."""
import os
import sys
import tempfile
import types
import unittest
from unittest import mock

import grpc
import numpy as np

import kplan
from kplan import Client, KplanError
from kplan.v1 import config_pb2, service_pb2
from test_client import start_server, stop_server


class _Refused(grpc.RpcError):
    """What a stub raises for a call the server failed."""

    def __init__(self, code, details):
        super().__init__(details)
        self._code, self._details = code, details

    def code(self):
        return self._code

    def details(self):
        return self._details

    def trailing_metadata(self):
        return ()


class _Stub:
    """Stands in for KernelPlanServiceStub: records every (method, request)
    and answers from `replies` (a message, or an exception to raise)."""

    def __init__(self, **replies):
        self.calls = []
        self.replies = replies

    def __getattr__(self, method):
        def call(request, timeout=None, metadata=None):
            self.calls.append((method, request))
            reply = self.replies[method]
            if isinstance(reply, Exception):
                raise reply
            return reply
        return call


def offline_client(stub):
    """A Client whose calls go to `stub` (nothing is ever connected)."""
    c = Client("unix:/nonexistent/kplan-cuda-ipc-test.sock", timeout=5,
               max_message_bytes=64 << 20, retries=0)
    c._stub = stub
    return c


def registered():
    return _Stub(RegisterSharedMemory=service_pb2.RegisterSharedMemoryResponse(),
                 UnregisterSharedMemory=service_pb2.UnregisterSharedMemoryResponse())


class LocalChecksTest(unittest.TestCase):
    def setUp(self):
        self.stub = registered()
        self.client = offline_client(self.stub)
        self.handle = os.urandom(64)

    def tearDown(self):
        self.client.close()

    def test_registration_arguments_name_the_field_and_send_nothing(self):
        bad = [
            (dict(handle=os.urandom(63)), "handle"),
            (dict(handle=os.urandom(66)), "handle"),  # torch's versioned layout, unwrapped
            (dict(handle=b""), "handle"),
            (dict(handle="0" * 64), "handle"),
            (dict(byte_size=0), "byte_size"),
            (dict(byte_size=-4096), "byte_size"),
            (dict(byte_size=4096.0), "byte_size"),
            (dict(byte_size=True), "byte_size"),
            (dict(device_id=-1), "device_id"),
            (dict(device_id="0"), "device_id"),
            (dict(name=""), "name"),
        ]
        for change, field in bad:
            args = dict(handle=self.handle, byte_size=4096, device_id=0, name=None)
            args.update(change)
            with self.subTest(change=change):
                with self.assertRaisesRegex(ValueError, rf"^{field}\b"):
                    self.client.register_cuda_memory(**args)
        self.assertEqual(self.stub.calls, [])

    def test_tensors_outside_the_region_name_the_argument(self):
        region = self.client.register_cuda_memory(self.handle, 1024)
        for args, field in [((-1, (4,), "float32"), "offset"),
                            ((0.5, (4,), "float32"), "offset"),
                            ((0, (2, -1), "float32"), "shape"),
                            ((0, (2.0,), "float32"), "shape"),
                            ((0, (4,), "float64"), "dtype"),
                            ((1020, (2,), "float32"), "offset"),   # 1020 + 8 > 1024
                            ((0, (257,), "float32"), "offset"),    # ... naming shape too
                            ((2048, (0,), "int32"), "offset"),
                            ((0, (2**40, 2**40), "float32"), "offset"),  # no int64 wrap
                            ((0, (2**31, 2**31, 4), "float32"), "offset")]:
            with self.subTest(args=args):
                with self.assertRaisesRegex(ValueError, rf"^{field}\b"):
                    region.tensor(args[1], args[2], offset=args[0])
        with self.assertRaisesRegex(ValueError, r"shape \(257,\)"):
            region.tensor((257,), "float32", offset=0)
        # Fits exactly: the last 8 bytes, and an empty tensor at the end.
        self.assertEqual(region.tensor((2,), "float32", offset=1016).ref().byte_size, 8)
        self.assertEqual(region.tensor((0, 4), "bfloat16", offset=1024).ref().byte_size, 0)
        self.assertEqual([m for m, _ in self.stub.calls], ["RegisterSharedMemory"])
        region.close()
        # No offset: after the last tensor placed, 64-byte aligned, as SharedMemoryRegion.array.
        region = self.client.register_cuda_memory(self.handle, 1024)
        a = region.tensor((3,), "float32")
        b = region.tensor((2, 2), "bfloat16")
        self.assertEqual((a.ref().offset, b.ref().offset, b.ref().byte_size), (0, 64, 8))
        with self.assertRaisesRegex(ValueError, r"^offset\b"):
            region.tensor((300,), "float32")  # 128 + 1200 > 1024
        region.close()

    def test_handle_of_torch_needs_torch_or_a_cuda_tensor(self):
        try:
            import torch
        except ImportError:
            with self.assertRaisesRegex(RuntimeError, "needs torch"):
                kplan.cuda_ipc.handle_of_torch(object())
            self.assertNotIn("torch", sys.modules)
            return
        with self.assertRaisesRegex(ValueError, "^tensor: a torch CUDA tensor"):
            kplan.cuda_ipc.handle_of_torch(torch.zeros(4))

    def test_handle_of_torch_reads_share_cuda(self):
        """Against a stand-in torch with _share_cuda_'s torch 2.x layout
        (torch/csrc/StorageSharing.cpp): (device, b"\\x02c" + handle, storage
        bytes, storage offset in the segment, ref counter, its offset, ...)."""
        released = []

        class Storage:
            def _share_cuda_(self):
                return (2, b"\x02c" + handle, 1 << 20, 4096, b"/torch_1_2", 7, b"", True)

        class UntypedStorage:
            @staticmethod
            def _release_ipc_counter_cuda(counter, offset):
                released.append((counter, offset))

        class Tensor:
            is_cuda = True

            def __init__(self, contiguous=True):
                self.contiguous = contiguous

            def is_contiguous(self):
                return self.contiguous

            def untyped_storage(self):
                return Storage()

            def storage_offset(self):
                return 10  # elements

            def element_size(self):
                return 2

        handle = self.handle
        fake = types.SimpleNamespace(Tensor=Tensor, UntypedStorage=UntypedStorage)
        with mock.patch.dict(sys.modules, {"torch": fake}):
            got = kplan.cuda_ipc.handle_of_torch(Tensor())
            self.assertEqual(got, (handle, 4096 + (1 << 20), 2, 4096 + 20))
            self.assertEqual(released, [(b"/torch_1_2", 7)])
            with self.assertRaisesRegex(ValueError, "^tensor: must be contiguous"):
                kplan.cuda_ipc.handle_of_torch(Tensor(contiguous=False))
            with self.assertRaisesRegex(ValueError, "^tensor: a torch CUDA tensor"):
                kplan.cuda_ipc.handle_of_torch(np.zeros(4))

    def test_torch_storage_handles_unwrap_to_the_cuda_ipc_handle(self):
        unwrap = kplan.cuda_ipc._cuda_ipc_handle
        self.assertEqual(unwrap(self.handle), self.handle)
        for version in (2, 3):
            self.assertEqual(unwrap(bytes([version]) + b"c" + self.handle), self.handle)
        with self.assertRaisesRegex(ValueError, "expandable_segments:False"):
            unwrap(b"\x02e" + os.urandom(100))
        with self.assertRaisesRegex(ValueError, "^tensor:"):
            unwrap(b"\x02c" + self.handle[:60])


class MessagesTest(unittest.TestCase):
    def test_register_sends_the_handle_size_device_and_name(self):
        stub = registered()
        c = offline_client(stub)
        handle = os.urandom(64)
        region = c.register_cuda_memory(handle, 3 << 20, device_id=3, name="acts")
        self.assertEqual(stub.calls[0][0], "RegisterSharedMemory")
        sent = stub.calls[0][1].region
        self.assertEqual(sent, service_pb2.SharedMemoryRegion(
            name="acts", byte_size=3 << 20, cuda_ipc_handle=handle, device_id=3))
        self.assertEqual((region.name, region.byte_size, region.device_id),
                         ("acts", 3 << 20, 3))
        # A memoryview of the handle, and a name made up when none is given.
        other = c.register_cuda_memory(memoryview(bytearray(handle)), 4096)
        sent = stub.calls[1][1].region
        self.assertEqual(sent.cuda_ipc_handle, handle)
        self.assertTrue(sent.name.startswith(f"kplan-py-cuda-{os.getpid()}-"), sent.name)
        self.assertEqual(other.name, sent.name)
        self.assertNotEqual(other.name, region.name)
        region.close()
        other.close()
        c.close()

    def test_run_moe_sends_references_and_returns_the_output_reference(self):
        m, h, e, k = 5, 64, 8, 2
        stub = registered()
        c = offline_client(stub)
        with c.register_cuda_memory(os.urandom(64), 1 << 16, name="dev") as region:
            x = region.tensor((m, h), "bfloat16", offset=0)
            logits = region.tensor((m, e), "float32", offset=x.byte_size + 4)  # any offset
            out = region.tensor((m, h), "bfloat16", offset=8192)
            ids = region.tensor((m, k), "int32", offset=12288)
            weights = region.tensor((m, k), "float32", offset=12288 + m * k * 4)
            stub.replies["RunMoE"] = service_pb2.RunMoEResponse(
                output=config_pb2.Tensor(dtype=config_pb2.DTYPE_BFLOAT16, shape=(m, h),
                                         shm=out.ref()))
            got, resp = c.run_moe("layer", x, logits, top_k=k, output=out, return_plan=True)
            self.assertIs(got, out)
            self.assertEqual(resp.output.shm.region, "dev")
            req = stub.calls[-1][1]
            self.assertEqual(stub.calls[-1][0], "RunMoE")
            self.assertEqual(req.hidden_states, config_pb2.Tensor(
                dtype=config_pb2.DTYPE_BFLOAT16, shape=(m, h),
                shm=config_pb2.SharedMemoryRef(region="dev", offset=0, byte_size=m * h * 2)))
            self.assertEqual(req.router_logits, config_pb2.Tensor(
                dtype=config_pb2.DTYPE_FLOAT32, shape=(m, e),
                shm=config_pb2.SharedMemoryRef(region="dev", offset=m * h * 2 + 4,
                                               byte_size=m * e * 4)))
            self.assertEqual(req.output_shm, config_pb2.SharedMemoryRef(
                region="dev", offset=8192, byte_size=m * h * 2))
            self.assertEqual(req.routing.top_k, k)

            # A given top-k by reference, inline hidden states, output in the response.
            stub.replies["RunMoE"] = service_pb2.RunMoEResponse(
                output=config_pb2.Tensor(dtype=config_pb2.DTYPE_FLOAT32, shape=(1, 2),
                                         data=b"\0" * 8))
            c.run_moe("layer", np.ones((1, 2), np.float32), topk_ids=ids, topk_weights=weights)
            req = stub.calls[-1][1]
            self.assertEqual(req.topk_ids.shm, ids.ref())
            self.assertEqual(req.topk_ids.dtype, config_pb2.DTYPE_INT32)
            self.assertEqual(req.topk_weights.shm, config_pb2.SharedMemoryRef(
                region="dev", offset=12288 + m * k * 4, byte_size=m * k * 4))
            self.assertEqual(len(req.hidden_states.data), 8)
            self.assertFalse(req.HasField("output_shm"))
            self.assertFalse(req.HasField("router_logits"))
            # Without return_plan: the reference alone.
            stub.replies["RunMoE"] = service_pb2.RunMoEResponse()
            self.assertIs(c.run_moe("layer", x, logits, output=out), out)
        self.assertEqual([m for m, _ in stub.calls].count("UnregisterSharedMemory"), 1)
        c.close()

    def test_unregister_once_and_errors(self):
        stub = registered()
        c = offline_client(stub)
        region = c.register_cuda_memory(os.urandom(64), 4096, name="a")
        region.unregister()
        self.assertEqual(stub.calls[-1][0], "UnregisterSharedMemory")
        self.assertEqual(stub.calls[-1][1].name, "a")
        region.unregister()
        region.close()
        with region:
            pass
        self.assertEqual([m for m, _ in stub.calls].count("UnregisterSharedMemory"), 1)

        # The server's refusal: unregister raises it, close swallows it.
        stub.replies["UnregisterSharedMemory"] = _Refused(grpc.StatusCode.NOT_FOUND, "gone")
        region = c.register_cuda_memory(os.urandom(64), 4096, name="b")
        with self.assertRaises(KplanError) as ctx:
            region.unregister()
        self.assertEqual(ctx.exception.code, grpc.StatusCode.NOT_FOUND)
        n = len(stub.calls)
        region.close()
        self.assertEqual(len(stub.calls), n)
        region = c.register_cuda_memory(os.urandom(64), 4096, name="c")
        region.close()  # does not raise
        self.assertEqual(stub.calls[-1][1].name, "c")

        # Any other error keeps the region, so close tries again.
        stub.replies["UnregisterSharedMemory"] = _Refused(grpc.StatusCode.UNAVAILABLE, "down")
        region = c.register_cuda_memory(os.urandom(64), 4096, name="e")
        with self.assertRaises(KplanError):
            region.unregister()
        n = len(stub.calls)
        region.close()
        self.assertEqual([(m, r.name) for m, r in stub.calls[n:]],
                         [("UnregisterSharedMemory", "e")])

        # A refused registration leaves nothing to unregister.
        stub.replies["RegisterSharedMemory"] = _Refused(grpc.StatusCode.ALREADY_EXISTS, "open")
        n = len(stub.calls)
        with self.assertRaises(KplanError) as ctx:
            c.register_cuda_memory(os.urandom(64), 4096, name="d")
        self.assertEqual(ctx.exception.code, grpc.StatusCode.ALREADY_EXISTS)
        del ctx
        self.assertEqual([m for m, _ in stub.calls[n:]], ["RegisterSharedMemory"])
        c.close()


class CpuServerTest(unittest.TestCase):
    """A CPU-path server (--devices=none) with --allow_shared_memory."""

    def setUp(self):
        tmp = tempfile.mkdtemp()
        server, _ = start_server(f"--listen=unix:{tmp}/cuda.sock", "--devices=none",
                                 "--allow_shared_memory")
        self.addCleanup(stop_server, server)
        self.client = Client(f"unix:{tmp}/cuda.sock", timeout=30)
        self.addCleanup(self.client.close)

    def test_a_cuda_region_is_refused_with_the_servers_message(self):
        for device_id in (0, 1):
            with self.assertRaises(KplanError) as ctx:
                self.client.register_cuda_memory(os.urandom(64), 1 << 20, device_id=device_id,
                                                 name="gpu")
            e = ctx.exception
            self.assertEqual(e.code, grpc.StatusCode.FAILED_PRECONDITION)
            self.assertEqual(e.field, "region.cuda_ipc_handle")
            self.assertIn("runs no GPU", e.message)
            self.assertIn(e.message, str(e))
        self.assertEqual(self.client.list_shared_memory(), [])

if __name__ == "__main__":
    unittest.main()
