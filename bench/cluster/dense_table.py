#!/usr/bin/python3
"""The dense ring against OpenMPI and Gloo, per cell of a sweep directory.

    /usr/bin/python3 bench/cluster/dense_table.py DIR    (DIR from bench/cluster/sweep.sh)

Prints a Markdown table: gradcomm's time in each of its runs (the one beside OpenMPI,
then the one beside Gloo), each peer's time, and peer time / gradcomm's mean time
(above 1: gradcomm faster); ratios below 0.95 are bold.
"""
import json,glob,collections,sys
d=sys.argv[1]
print("| N | rate | size | gradcomm (two runs) | OpenMPI | Gloo | vs MPI | vs Gloo |")
print("|---|---|---|---|---|---|---|---|")
for n in (2,4,8):
  for rate in ("1gbit","10gbit","25gbit"):
    f=f"{d}/n{n}-{rate}.json"
    try: recs=json.load(open(f))
    except Exception: continue
    t=collections.defaultdict(list)
    for r in recs:
        if r['compressor']!='none': continue
        t[(r['size_bytes'],r['impl'])].append(r['time_us']/1000)
    for s in sorted({k[0] for k in t}):
        g=t[(s,'gradcomm')]; m=t.get((s,'mpi'),[0]); gl=t.get((s,'gloo'),[0])
        gm=sum(g)/len(g)
        flag=lambda x: f"**{x:.2f}**" if x<0.95 else f"{x:.2f}"
        print(f"| {n} | {rate} | {s>>20} MB | {' / '.join(f'{x:.1f}' for x in g)} | {m[0]:.1f} | {gl[0]:.1f} | {flag(m[0]/gm)} | {flag(gl[0]/gm)} |")
