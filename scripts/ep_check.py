#!/usr/bin/env python3
"""Expert-parallel RunMoE against the single-device server, over the API.

usage: ep_check.py SINGLE_ADDR EP_ADDR [--ranks N] [--small]

SINGLE_ADDR serves RunMoE on one device (--devices=0, or the CPU path); EP_ADDR
is a server whose expert-parallel group has N ranks (--devices=0,1, or
--cpu_ep_ranks=N). Loads the same random bfloat16 layer on both and compares
RunMoE per dispatch (all2all_backend), token count and top-k:
kplan_all2allv must be bit-identical; allgather_reducescatter too when k <= 2,
else within one bfloat16 ulp (its fp32 sums are re-associated over ranks).
Exits 1 on any mismatch. scripts/ep-check.sh starts both servers.
"""
import argparse
import sys

import numpy as np

from kplan import Client, KplanError


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("single")
    ap.add_argument("ep")
    ap.add_argument("--ranks", type=int, required=True)
    ap.add_argument("--small", action="store_true", help="a small layer (CPU path)")
    args = ap.parse_args()
    E, H, I = (6, 128, 64) if args.small else (16, 2048, 768)
    rng = np.random.default_rng()
    w13 = rng.normal(0, 1 / np.sqrt(H), (E, 2 * I, H)).astype(np.float32)
    w2 = rng.normal(0, 1 / np.sqrt(I), (E, H, I)).astype(np.float32)
    failures = 0
    with Client(args.single, timeout=120) as single, Client(args.ep, timeout=120) as ep:
        group = ep.info().ep_group
        print(f"group: {group.size} ranks on {list(group.devices)} over {group.communicator}")
        if group.size != args.ranks:
            print(f"FAIL: expected {args.ranks} ranks")
            return 1
        for c in (single, ep):
            try:
                c.unload_experts("ep_check")
            except KplanError:
                pass
        single.load_experts("ep_check", w13, w2, dtype="bfloat16")
        info = ep.load_experts("ep_check", w13, w2, dtype="bfloat16")
        for s in info.shards:
            print(f"  rank {s.rank} on {s.device}: experts [{s.first_expert}, "
                  f"{s.first_expert + s.num_experts}), {s.bytes} bytes")
        if len(info.shards) != args.ranks:
            print("FAIL: the experts are not placed on the group (see the server log)")
            return 1
        print(f"{'all2all_backend':24} {'M':>5} {'k':>2} {'result':28} {'1-dev us':>9} {'EP us':>9}")
        for strategy in ("allgather_reducescatter", "kplan_all2allv"):
            for k in (2, 4):
                for m in (1, args.ranks - 1 or 1, 7, 64, 333):
                    x = rng.normal(0, 1, (m, H)).astype(np.float32)
                    logits = rng.normal(0, 1, (m, E)).astype(np.float32)
                    kw = dict(router_logits=logits, top_k=k, routing_method="Renormalize",
                              dtype="bfloat16", return_plan=True)
                    want, r1 = single.run_moe("ep_check", x, **kw)
                    got, r2 = ep.run_moe("ep_check", x, all2all_backend=strategy, **kw)
                    exact = strategy == "kplan_all2allv" or k <= 2
                    same = np.array_equal(got, want)
                    rel = float(np.max(np.abs(got - want) / np.maximum(np.abs(want), 1e-3)))
                    ok = same if exact else rel <= 1 / 128
                    ok = ok and r2.plan.ep_size == args.ranks and \
                        r2.plan.all2all_backend == strategy
                    result = "bit-identical" if same else f"max rel diff {rel:.2e}"
                    print(f"{strategy:24} {m:>5} {k:>2} {result + ('' if ok else ' FAIL'):28} "
                          f"{r1.timing.device_us:9.0f} {r2.timing.device_us:9.0f}")
                    failures += not ok
        try:
            ep.run_moe("ep_check", x, router_logits=logits, top_k=2, dtype="bfloat16",
                       all2all_backend="bogus")
            print("FAIL: all2all_backend='bogus' was accepted")
            failures += 1
        except KplanError as e:
            print(f"bogus all2all_backend: {e.code.name} on {e.field}")
            failures += e.field != "parallel.all2all_backend"
        for c in (single, ep):
            c.unload_experts("ep_check")
    print("OK" if failures == 0 else f"{failures} FAILED")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
