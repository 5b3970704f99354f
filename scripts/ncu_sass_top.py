#!/usr/bin/env python3
"""Summarises an ncu source page (SASS) of one kernel: the warp instructions
executed, the stall reasons' shares and the SASS lines with the most stall
samples. The input is what
  ncu --import prof.ncu-rep --page source --csv --print-source sass > sass.csv
writes (plain or gzipped); profile with --section SourceCounters.
usage: scripts/ncu_sass_top.py sass.csv[.gz] [lines]"""
import csv
import gzip
import sys


def main():
    path = sys.argv[1]
    top_n = int(sys.argv[2]) if len(sys.argv) > 2 else 30
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        rows = list(csv.reader(f))
    header_at = next((i for i, r in enumerate(rows) if r and r[0] == "Address"), None)
    if header_at is None:
        sys.exit(f"{path}: no SASS table (was the kernel profiled with SourceCounters?)")
    header = rows[header_at]
    col = {name: i for i, name in enumerate(header)}
    data = [r for r in rows[header_at + 1:] if len(r) == len(header)]

    def num(row, name):
        try:
            return float(row[col[name]].replace(",", ""))
        except (KeyError, ValueError):
            return 0.0

    samples = "Warp Stall Sampling (All Samples)"
    stalls = [n for n in header if n.startswith("stall_") and "Not Issued" not in n]
    total_samples = max(sum(num(r, samples) for r in data), 1.0)
    total_instr = sum(num(r, "Instructions Executed") for r in data)
    print(f"sass lines {len(data)} warp instructions executed {total_instr:.0f} "
          f"stall samples {total_samples:.0f}")
    by_reason = sorted(((sum(num(r, n) for r in data), n) for n in stalls), reverse=True)
    print("stalls:", ", ".join(f"{n[6:]} {v / total_samples * 100:.1f}%" for v, n in by_reason[:8]))
    for r in sorted(data, key=lambda r: -num(r, samples))[:top_n]:
        why = max(stalls, key=lambda n: num(r, n))[6:] if stalls else ""
        print(f"{num(r, samples) / total_samples * 100:5.1f}% {why:12s} "
              f"x{num(r, 'Instructions Executed'):10.0f} {r[col['Address']]} "
              f"{r[col['Source']][:80]}")


if __name__ == "__main__":
    main()
