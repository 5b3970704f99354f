#!/usr/bin/env python3
"""Draws kplan_perf --json results: p50/p90/p99 latency and requests/s
against concurrency, one line per tokens-per-request, for each file given
(e.g. TCP and a Unix socket, or coalescing off and on).

    python3 bench/plot_perf.py --out docs/perf_concurrency.png tcp.json unix.json

Needs python3-matplotlib (Debian).
"""
import argparse
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("files", nargs="+", help="kplan_perf --json outputs")
    p.add_argument("--out", required=True, help="image to write (.png or .svg)")
    args = p.parse_args()
    fig, (lat, thr) = plt.subplots(1, 2, figsize=(12, 4.5))
    for path in args.files:
        with open(path) as f:
            data = json.load(f)
        if "rows" not in data:
            raise SystemExit(f"{path}: no 'rows' (not a kplan_perf --json file)")
        label = os.path.splitext(os.path.basename(path))[0]
        for tokens in sorted({r["tokens"] for r in data["rows"]}):
            rows = sorted((r for r in data["rows"] if r["tokens"] == tokens and r["requests"]),
                          key=lambda r: r["concurrency"])
            c = [r["concurrency"] for r in rows]
            for q, style in (("p50_us", "-"), ("p99_us", ":")):
                lat.plot(c, [r[q] for r in rows], style, marker="o",
                         label=f"{label}, {tokens} tok, {q[:3]}")
            thr.plot(c, [r["req_per_s"] for r in rows], marker="o", label=f"{label}, {tokens} tok")
    lat.set_title("RunMoE latency")
    lat.set_ylabel("us")
    lat.set_yscale("log")
    thr.set_title("RunMoE throughput")
    thr.set_ylabel("requests/s")
    for ax in (lat, thr):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent clients")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
