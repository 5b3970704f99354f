#!/usr/bin/env python3
"""Resolves a KernelConfig through a running kplan-server and prints the plan.

    PYTHONPATH=build/python:client/python python3 client/python/example.py localhost:50051
"""
import sys

from kplan_client import Client, KplanError

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
