#!/usr/bin/python3
"""Tables from bench/shm/run.sh's folder: per size, the median over rounds of gradcomm's and the
peer's time and of their ratio (peer time / gradcomm time, > 1: gradcomm faster), then the
median over sizes of the 256K-64M rows (the issue's measure), and the copy floor.

    /usr/bin/python3 bench/shm/report.py OUT_DIR
"""
import glob
import os
import re
import statistics
import sys

out = sys.argv[1]


def rows(path):
    """size -> (gradcomm us, path, peer us) from one gradcomm-bench table."""
    table = {}
    for line in open(path):
        if line.startswith("#") or not line.strip():
            continue
        f = line.split()
        if len(f) < 14 or not f[0].isdigit():
            continue
        # size count type redop root time algbw busbw #wrong wire compr B_time B_algbw B_busbw B_#wrong ratio
        table[int(f[0])] = (float(f[5]), f[10], float(f[11]))
    return table


for what in ("allreduce-mpi", "reduce_scatter-mpi", "allreduce-gloo"):
    for n in (2, 4):
        files = sorted(glob.glob(os.path.join(out, f"*-{what}-n{n}.txt")))
        tables = [rows(p) for p in files]
        tables = [t for t in tables if t]
        if not tables:
            continue
        peer = what.split("-")[1]
        print(f"\n### {what.split('-')[0]}, N = {n}, against {peer} ({len(tables)} rounds)\n")
        print(f"| bytes | gradcomm µs | {peer} µs | ratio, median [rounds] | path |")
        print("|---|---|---|---|---|")
        big = []
        for size in sorted(set().union(*tables)):
            got = [t[size] for t in tables if size in t]
            g = statistics.median(x[0] for x in got)
            p = statistics.median(x[2] for x in got)
            ratios = [x[2] / x[0] for x in got if x[0] > 0]
            r = statistics.median(ratios)
            if size >= 256 << 10:
                big.append(r)
            print(f"| {size} | {g:.1f} | {p:.1f} | {r:.2f} [{min(ratios):.2f}-{max(ratios):.2f}] | {got[0][1]} |")
        if big:
            print(f"\nmedian ratio over 256K-64M: {statistics.median(big):.2f}")

for n in (2, 4):
    path = os.path.join(out, f"copy-n{n}.txt")
    if os.path.exists(path):
        t = [float(m) for m in re.findall(r"median_us=([0-9.]+)", open(path).read())]
        if t:
            print(f"\ncopy floor, N = {n} (16 MiB memcpy per rank, all ranks at once): median {statistics.median(t):.0f} µs "
                  f"over {len(t)} rank-rounds [{min(t):.0f}-{max(t):.0f}]")
