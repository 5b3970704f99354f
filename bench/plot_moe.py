#!/usr/bin/env python3
"""Draws MoE layer benchmarks: for each shape, latency against tokens (kplan,
each baseline, and the roofline floor of the run) and throughput (TFLOP/s)
against tokens, from the --json files of bench/moe_bench and
bench/moe_baseline.py (schema: {system, device, rooflines: {copy_gbps,
matmul_tflops}, rows: [{shape, tokens, ok, us, tflops, floor_us, ...}]}).

    python3 bench/plot_moe.py --out docs/moe_bench.png kplan.json torch.json

Needs python3-matplotlib (Debian). The floor is the first file's: max(bytes of
the experts hit / copy bandwidth, FLOPs / dense matmul), measured in its run.
"""
import argparse
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def load(path):
    with open(path) as f:
        data = json.load(f)
    for key in ("system", "rooflines", "rows"):
        if key not in data:
            raise SystemExit(f"{path}: no '{key}' (not a moe_bench / moe_baseline.py --json file)")
    return data


def series(data, shape, key):
    rows = sorted((r for r in data["rows"] if r.get("ok") and r["shape"] == shape),
                  key=lambda r: r["tokens"])
    return [r["tokens"] for r in rows], [r[key] for r in rows]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("files", nargs="+", help="--json outputs; the first is drawn with its floor")
    p.add_argument("--out", required=True, help="image to write (.png or .svg)")
    args = p.parse_args()
    runs = [load(f) for f in args.files]
    shapes = []
    for run in runs:
        for r in run["rows"]:
            if r["shape"] not in shapes:
                shapes.append(r["shape"])
    if not shapes:
        raise SystemExit("no rows to draw")
    fig, axes = plt.subplots(2, len(shapes), figsize=(5 * len(shapes), 8), squeeze=False)
    for col, shape in enumerate(shapes):
        lat, thr = axes[0][col], axes[1][col]
        for run in runs:
            x, y = series(run, shape, "us")
            lat.plot(x, y, marker="o", label=run["system"])
            x, y = series(run, shape, "tflops")
            thr.plot(x, y, marker="o", label=run["system"])
        x, y = series(runs[0], shape, "floor_us")
        lat.plot(x, y, linestyle="--", color="gray", label="roofline floor")
        thr.axhline(runs[0]["rooflines"]["matmul_tflops"], linestyle="--", color="gray",
                    label="dense bf16 matmul")
        lat.set_title(f"{shape}: layer latency")
        thr.set_title(f"{shape}: throughput")
        for ax in (lat, thr):
            ax.set_xscale("log", base=2)
            ax.set_xlabel("tokens")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8)
        lat.set_yscale("log")
        lat.set_ylabel("us (median)")
        thr.set_ylabel("TFLOP/s")
    fig.suptitle(f"MoE layer, {runs[0].get('device', '')}")
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
