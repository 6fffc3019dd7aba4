#!/usr/bin/env python3
"""Criterion's raw samples of the last run of each benchmark, per iteration: the lowest sample,
the lowest tenth (p10), the median and p90.

This machine alternates between quiet spells and spells where everything runs about twice as
slow (another tenant on the same cores): round robin's pick reads 17 ns in the first and 35 ns
in the second, within one run. Criterion's estimate (a mean) mixes the two in whatever share
the run met; the low end of the samples is the pick's own cost, the share of slow samples is
the machine's. Run the contenders interleaved, several times, and compare the lows of the same
runs (docs/benchmarks.md, "The pick").

Usage: scripts/criterion-samples.py [FILTER]   (a substring of the benchmark's path, e.g.
       pick_channel/busy); reads target/criterion.
"""
import json
import os
import sys


def main():
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "target", "criterion")
    want = sys.argv[1] if len(sys.argv) > 1 else ""
    rows = []
    for dirpath, _, files in os.walk(root):
        if "sample.json" not in files or os.path.basename(dirpath) != "new":
            continue
        name = os.path.relpath(os.path.dirname(dirpath), root)
        if want not in name:
            continue
        with open(os.path.join(dirpath, "sample.json")) as f:
            s = json.load(f)
        per = sorted(t / i for t, i in zip(s["times"], s["iters"]))
        n = len(per)
        rows.append((name, n, per[0], per[n // 10], per[n // 2], per[9 * n // 10]))
    print(f"{'benchmark':60s} {'n':>4s} {'min':>9s} {'p10':>9s} {'median':>9s} {'p90':>9s}  (ns)")
    for name, n, lo, p10, med, p90 in sorted(rows):
        print(f"{name:60s} {n:4d} {lo:9.1f} {p10:9.1f} {med:9.1f} {p90:9.1f}")


if __name__ == "__main__":
    main()
