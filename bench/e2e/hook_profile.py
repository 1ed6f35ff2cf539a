#!/usr/bin/python3
"""Where a gradcomm DDP hook's time goes, from records of `bench/e2e/run.sh --profile`
(ddp_step.py --profile: one entry per hook call on every rank). Prints markdown:

    /usr/bin/python3 bench/e2e/hook_profile.py DIR [--compute-dir DIR2]

Per variant (the values: median over the profiled runs of each run's mean over calls, ranks
and steps -- means, so that a call's parts add up -- and the range over runs):
  - DDP's buckets as the hook saw them (elements, parameters);
  - per bucket and call: hook wall time; inside the C++ collective (stats total_s delta) and
    its split (encode, decode, reduce, wire wait); Python overhead (wall - C++);
    arrival wait (the last rank's entry minus this rank's: waiting for slower peers, not for
    the network); the collective after the last arrival (latest exit - latest entry);
    bytes sent and their time at the link rate;
  - per step: step time, the hooks' sum, the time neither in the hooks nor in the compute
    floor (the `compute` variant, from the same DIR or --compute-dir), minor page faults,
    involuntary context switches, CPU seconds.
"""
import argparse
import json
import os
import statistics
from collections import defaultdict

RATE_UNITS = {"k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}


def rate_bytes(rate):
    r = rate.lower()
    for suffix, div in (("bit", 8), ("bps", 1)):
        if r.endswith(suffix):
            num = r[:-len(suffix)]
            mult = RATE_UNITS.get(num[-1], 1)
            return float(num.rstrip("kmgt")) * mult / div
    raise ValueError(rate)


def med(v):
    return statistics.median(v) if v else float("nan")


def cell(values, scale=1e3, digits=1):
    """'median (lo–hi)' of per-run values."""
    if not values:
        return "–"
    m, lo, hi = med(values), min(values), max(values)
    f = lambda x: f"{x * scale:.{digits}f}"
    return f"{f(m)} ({f(lo)}–{f(hi)})" if len(values) > 1 else f(m)


def run_stats(rec):
    """Per-run medians of the per-call and per-step quantities."""
    calls = rec["hook_calls"]  # [rank][call]
    n = len(calls)
    by_key = defaultdict(dict)  # (step, bucket) -> rank -> call
    for rank, rc in enumerate(calls):
        for c in rc:
            if c["step"] >= 0:
                by_key[(c["step"], c["bucket"])][rank] = c
    per_bucket = defaultdict(lambda: defaultdict(list))
    hooks_per_step = defaultdict(float)  # (rank, step) -> summed hook wall
    for (step, bucket), ranks in by_key.items():
        if len(ranks) != n:
            continue
        last_in = max(c["enter"] for c in ranks.values())
        last_out = max(c["enter"] + c["wall_s"] for c in ranks.values())
        b = per_bucket[bucket]
        b["after_last_arrival_s"].append(last_out - last_in)
        for rank, c in ranks.items():
            b["numel"].append(c["numel"])
            b["params"].append(c["params"])
            for k in ("wall_s", "cxx_s", "encode_s", "decode_s", "reduce_s", "comm_s", "bytes_sent"):
                b[k].append(c[k])
            b["python_s"].append(c["wall_s"] - c["cxx_s"])
            b["arrival_wait_s"].append(last_in - c["enter"])
            hooks_per_step[(rank, step)] += c["wall_s"]
    steps = [s for rs in rec["per_rank_steps"] for s in rs]
    # Means within a run, so that the parts of a call add up to its wall time.
    out = {"buckets": {b: {k: statistics.fmean(v) for k, v in d.items()} for b, d in sorted(per_bucket.items())},
           "step_s": rec["step_s_median"],
           "hooks_s": statistics.fmean(hooks_per_step.values()),
           "backward_s": rec["backward_s_median"], "forward_s": rec["forward_s_median"],
           "optimizer_s": rec["optimizer_s_median"],
           "minflt": med([s["minflt"] for s in steps]), "preempted": med([s.get("preempted", 0) for s in steps]),
           "cpu_s": med([s["cpu_s"] for s in steps])}
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--compute-dir", help="records with the `compute` variant (default: DIR)")
    a = ap.parse_args()
    recs = [json.loads(l) for l in open(os.path.join(a.dir, "records.jsonl")) if l.strip()]
    comp = recs if not a.compute_dir else [json.loads(l) for l in open(os.path.join(a.compute_dir, "records.jsonl"))]
    floor = {}
    for r in comp:
        if r.get("ok") and r["variant"] == "compute":
            floor.setdefault(r["link_rate"], []).append(r)
    groups = defaultdict(list)
    for r in recs:
        if r.get("ok") and any(r.get("hook_calls") or []):
            groups[(r["link_rate"], r["variant"])].append(r)
    for (rate, variant), runs in sorted(groups.items()):
        stats = [run_stats(r) for r in runs]
        ranks = runs[0]["ranks"]
        bps = rate_bytes(rate)
        print(f"### `{variant}` at {rate}, {ranks} ranks ({len(runs)} runs; per call and rank, ms: mean in a run, "
              f"median over runs (range))\n")
        print("| bucket | elements | params | hook wall (ms) | in C++ | encode | decode | reduce | wire wait "
              "| Python | arrival wait | after last arrival | sent (KB) | sent / rate (ms) |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for b in sorted(stats[0]["buckets"]):
            col = lambda k: [s["buckets"][b][k] for s in stats if b in s["buckets"]]
            sent = col("bytes_sent")
            print(f"| {b} | {int(med(col('numel')))} | {int(med(col('params')))} | {cell(col('wall_s'))} | "
                  f"{cell(col('cxx_s'))} | {cell(col('encode_s'))} | {cell(col('decode_s'))} | "
                  f"{cell(col('reduce_s'))} | {cell(col('comm_s'))} | {cell(col('python_s'), digits=2)} | "
                  f"{cell(col('arrival_wait_s'))} | {cell(col('after_last_arrival_s'))} | "
                  f"{cell(sent, scale=1e-3, digits=0)} | {cell([x / bps for x in sent])} |")
        fl = [r["step_s_median"] for r in floor.get(rate, [])]
        fb = [r["backward_s_median"] for r in floor.get(rate, [])]
        col = lambda k: [s[k] for s in stats]
        print(f"\nPer step: step (median of the per-step max over ranks) {cell(col('step_s'))} ms; hooks {cell(col('hooks_s'))} ms; "
              f"forward {cell(col('forward_s'))}, backward incl. hooks {cell(col('backward_s'))}, optimizer "
              f"{cell(col('optimizer_s'))} ms; compute floor {cell(fl)} ms (its backward {cell(fb)} ms); "
              f"step - floor - hooks {cell([s['step_s'] - med(fl) - s['hooks_s'] for s in stats]) if fl else '–'} ms; "
              f"minor faults {cell(col('minflt'), scale=1, digits=0)}; involuntary context switches "
              f"{cell(col('preempted'), scale=1, digits=0)}; CPU {cell(col('cpu_s'))} ms.\n")


if __name__ == "__main__":
    main()
