#!/usr/bin/env python3
"""Resolves a KernelConfig through a running kplan-server and prints the plan.

    PYTHONPATH=client/python python3 client/python/example.py localhost:50051
(or with the package installed: pip install --no-index --no-build-isolation ./client/python)
"""
import sys

import numpy as np

from kplan import Client, KplanError

target = sys.argv[1] if len(sys.argv) > 1 else "localhost:50051"
with Client(target) as client:
    print("serving:", client.health())
    plan = client.resolve(moe_backend="flashinfer_moe_ep_cutedsl", platform="cuda:10.0")
    print("all2all_backend:", plan.parallel.all2all_backend)
    print("rms_norm priority:", list(plan.kernel_config.ir_op_priority.rms_norm))
    print("config_hash:", plan.config_hash)
    try:
        client.resolve(moe_backend="no_such_backend")
    except KplanError as e:
        print("rejected:", e.code.name, "field", e.field)

    # A small MoE layer: 8 experts, top-2, H=64, I=32.
    rng = np.random.default_rng(0)
    w13 = rng.normal(0, 0.1, (8, 64, 64)).astype(np.float32)
    w2 = rng.normal(0, 0.1, (8, 64, 32)).astype(np.float32)
    print("loaded bytes:", client.load_experts("example", w13, w2).bytes)
    x = rng.normal(0, 1, (4, 64)).astype(np.float32)
    logits = rng.normal(0, 1, (4, 8)).astype(np.float32)
    y, resp = client.run_moe("example", x, logits, top_k=2, return_plan=True)
    print("output:", y.shape, "backend:", resp.plan.backend, "device us:", round(resp.timing.device_us, 1),
          "coalesced requests:", resp.timing.coalesced_requests)
    client.unload_experts("example")
