#!/usr/bin/python3
"""Tables, plots and the alpha-beta model check for a cluster sweep (bench/cluster/sweep.sh).

    /usr/bin/python3 bench/cluster/report.py DIR [--model-only]

Reads DIR/n<N>-<rate>.json (bench/cluster/run.sh records), writes DIR/table.md (time per
allreduce, speed-up over gradcomm's dense ring and over the peers, per-phase split),
DIR/time-vs-size.png, DIR/speedup-vs-rate.png and DIR/model.md (the model of
bench/README.md, its predictions against the measurements).

The model (per rank, one link of rate B bytes/s, N ranks, S bytes of fp32; bench/README.md):
    dense ring      T = 2(N-1)/N * S / B
    compressed      max(T_c, W/B) <= T <= T_c + W/B
where W is the measured wire bytes per rank (gradcomm-bench's `wire`) and T_c the measured
encode + decode + reduce time of that compressor at that size and N (stats()): the lower
bound when the pipelined ring hides compute behind the wire, the upper when it cannot.
"""
import argparse
import collections
import glob
import json
import os
import re
import sys


def rate_bytes(rate):
    m = re.fullmatch(r"([0-9.]+)([kmgt]?)bit", rate)
    return float(m[1]) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}[m[2]] / 8


def load(directory):
    recs = []
    for path in sorted(glob.glob(os.path.join(directory, "n*-*.json"))):
        try:
            with open(path) as f:
                got = json.load(f)
        except json.JSONDecodeError as e:
            sys.exit(f"report.py: {path}:{e.lineno}: not JSON ({e.msg})")
        if not isinstance(got, list) or any(not isinstance(r, dict) or "ranks" not in r for r in got):
            sys.exit(f"report.py: {path}: expected a list of bench/cluster/run.sh records")
        recs.extend(got)
    return recs


def setting(recs):
    """What every record shares, for the figure titles: op, dtype, device, delay."""
    first = recs[0]
    parts = [str(first[k]) for k in ("op", "dtype", "device") if all(r.get(k) == first.get(k) for r in recs)
             and first.get(k)]
    delays = {(r.get("delay"), r.get("delay_applied")) for r in recs}
    if len(delays) == 1:
        delay, applied = delays.pop()
        if delay not in (None, "", "0"):
            parts.append(f"delay {delay}" + (" (not applied)" if applied is False else ""))
    return ", ".join(parts)


def key_of(r):
    impl = r["impl"]
    return impl if impl != "gradcomm" else (
        "gradcomm ring" if r["compressor"] == "none" else r["compressor"])


def short(name):
    return name.split(",cols")[0]


def mean_by(recs):
    """(ranks, rate, size, series) -> record with time_us averaged (dense ring runs twice)."""
    groups = collections.defaultdict(list)
    for r in recs:
        groups[(r["ranks"], r["link_rate"], r["size_bytes"], key_of(r))].append(r)
    out = {}
    for k, rs in groups.items():
        m = dict(rs[0])
        for f in ("time_us", "encode_us", "decode_us", "reduce_us", "comm_us", "wire_bytes"):
            vals = [x[f] for x in rs if x.get(f) is not None]
            m[f] = sum(vals) / len(vals) if vals else None
        out[k] = m
    return out


def fmt_size(b):
    for unit, f in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if b >= f and b % f == 0:
            return f"{b // f}{unit}"
    return str(b)


def rate_sort(rate):
    return rate_bytes(rate)


def write_table(cells, directory):
    ranks = sorted({k[0] for k in cells})
    rates = sorted({k[1] for k in cells}, key=rate_sort)
    sizes = sorted({k[2] for k in cells})
    series = sorted({k[3] for k in cells}, key=lambda s: (s not in ("gradcomm ring", "mpi", "gloo"), s))
    lines = ["# Cluster emulation: time per allreduce (ms) and speed-up over gradcomm's dense ring", ""]
    for n in ranks:
        for rate in rates:
            present = [s for s in series if any((n, rate, z, s) in cells for z in sizes)]
            if not present:
                continue
            lines.append(f"## N = {n}, {rate} per rank")
            lines.append("")
            lines.append("| size | " + " | ".join(short(s) for s in present) + " |")
            lines.append("|---" * (len(present) + 1) + "|")
            for z in sizes:
                dense = cells.get((n, rate, z, "gradcomm ring"))
                row = [fmt_size(z)]
                for s in present:
                    c = cells.get((n, rate, z, s))
                    if c is None:
                        row.append("-")
                        continue
                    t = c["time_us"] / 1e3
                    cell = f"{t:.1f}"
                    if dense and s in ("mpi", "gloo"):
                        cell += f" ({c['time_us'] / dense['time_us']:.2f}x)"  # peer time / gradcomm time
                    elif dense and s != "gradcomm ring":
                        cell += f" (**{dense['time_us'] / c['time_us']:.1f}x**)"
                    row.append(cell)
                lines.append("| " + " | ".join(row) + " |")
            lines.append("")
            lines.append("Per-phase split at the largest size (ms per allreduce: encode / decode / reduce / wire wait):")
            lines.append("")
            z = sizes[-1]
            for s in present:
                c = cells.get((n, rate, z, s))
                if c is None or c.get("encode_us") is None:
                    continue
                lines.append(f"- {short(s)}: {c['encode_us'] / 1e3:.1f} / {c['decode_us'] / 1e3:.1f} / "
                             f"{c['reduce_us'] / 1e3:.1f} / {c['comm_us'] / 1e3:.1f}; "
                             f"wire {c['wire_bytes'] / 1e6:.2f} MB per rank")
            lines.append("")
    lines.append("For mpi and gloo, (x) is gradcomm ring's speed-up over that peer (>1: gradcomm faster);")
    lines.append("for compressors, (**x**) is the compressor's speed-up over gradcomm's dense ring.")
    open(os.path.join(directory, "table.md"), "w").write("\n".join(lines) + "\n")


def compute_s(c):
    return ((c.get("encode_us") or 0) + (c.get("decode_us") or 0) + (c.get("reduce_us") or 0)) / 1e6


def write_model(cells, directory):
    """Two bounds for a compressed run: serial (compute, then wire) and overlapped
    (the pipelined ring hides one behind the other: max of the two)."""
    lines = ["# Model check: alpha-beta network cost plus measured compression time", "",
             "Dense ring: T = 2(N-1)/N * S/B. Compressed: between T_overlap = max(T_c, W/B) (compute fully",
             "hidden behind the wire, as the pipelined ring tries to do) and T_serial = T_c + W/B, with T_c the",
             "measured encode+decode+reduce time of that run (stats()) and W its measured wire bytes per rank.",
             "Break-even B*: the link rate above which compression stops beating the dense ring at this size",
             "and N: (D - W)/T_c when serial, D/T_c when overlapped (D = 2(N-1)/N * S). Below it compression pays.",
             "", "| N | rate | size | series | measured (ms) | model (ms) | measured/model | B* serial..overlap (Gbit/s) |",
             "|---|---|---|---|---|---|---|---|"]
    for (n, rate, z, s), c in sorted(cells.items(), key=lambda kv: (kv[0][0], rate_sort(kv[0][1]), kv[0][2], kv[0][3])):
        if s in ("mpi", "gloo"):
            continue
        b = rate_bytes(rate)
        d = 2 * (n - 1) / n * z
        meas = c["time_us"] / 1e6
        if s == "gradcomm ring":
            pred = d / b
            lines.append(f"| {n} | {rate} | {fmt_size(z)} | {s} | {meas * 1e3:.1f} | {pred * 1e3:.1f} | "
                         f"{meas / pred:.2f} | - |")
            continue
        tc, w = compute_s(c), c["wire_bytes"]
        lo, hi = max(tc, w / b), tc + w / b
        if tc > 0:
            be = f"{max(d - w, 0) / tc * 8 / 1e9:.1f}..{d / tc * 8 / 1e9:.1f}"
        else:
            be = "-"
        inside = "in" if lo * 0.9 <= meas <= hi * 1.1 else ("below" if meas < lo else "above")
        lines.append(f"| {n} | {rate} | {fmt_size(z)} | {short(s)} | {meas * 1e3:.1f} | {lo * 1e3:.1f}..{hi * 1e3:.1f} | "
                     f"{inside} | {be} |")
    open(os.path.join(directory, "model.md"), "w").write("\n".join(lines) + "\n")


def plots(cells, directory, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    ranks = sorted({k[0] for k in cells})
    rates = sorted({k[1] for k in cells}, key=rate_sort)
    series = sorted({k[3] for k in cells}, key=lambda s: (s not in ("gradcomm ring", "mpi", "gloo"), s))
    # One colour per series for both figures (the default cycle has 10: the 11th would
    # repeat the first); the peers are dashed.
    palette = plt.get_cmap("tab20").colors
    color = {s: palette[(2 * i) % 20 + (2 * i) // 20] for i, s in enumerate(series)}
    fig, axes = plt.subplots(len(ranks), len(rates), figsize=(5 * len(rates), 4 * len(ranks)), squeeze=False)
    for i, n in enumerate(ranks):
        for j, rate in enumerate(rates):
            ax = axes[i][j]
            for s in series:
                pts = sorted((k[2], c["time_us"] / 1e3) for k, c in cells.items() if k[0] == n and k[1] == rate and k[3] == s)
                if pts:
                    style = "--" if s in ("mpi", "gloo") else "-"
                    ax.plot([p[0] / 2**20 for p in pts], [p[1] for p in pts], style, marker="o", ms=3, label=short(s),
                            color=color[s])
            ax.set_xscale("log"); ax.set_yscale("log")
            ax.set_title(f"N={n}, {rate}"); ax.set_xlabel("size (MiB)"); ax.set_ylabel("time per allreduce (ms)")
            ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"Time per call: {title}" if title else "Time per call")
    fig.tight_layout()
    fig.savefig(os.path.join(directory, "time-vs-size.png"), dpi=90)

    # Speed-up against link rate at 100 MB (the size) when measured, and at the largest size.
    all_sizes = {k[2] for k in cells}
    plot_sizes = sorted({z for z in (100 * 2**20, max(all_sizes)) if z in all_sizes})
    fig, axes = plt.subplots(len(plot_sizes), len(ranks), figsize=(5 * len(ranks), 4 * len(plot_sizes)), squeeze=False)
    for row, zmax in enumerate(plot_sizes):
        for i, n in enumerate(ranks):
            ax = axes[row][i]
            for s in series:
                if s == "gradcomm ring":
                    continue
                pts = []
                for rate in rates:
                    d, c = cells.get((n, rate, zmax, "gradcomm ring")), cells.get((n, rate, zmax, s))
                    if d and c:
                        pts.append((rate_bytes(rate) * 8 / 1e9, d["time_us"] / c["time_us"]))
                if pts:
                    style = "--" if s in ("mpi", "gloo") else "-"
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], style, marker="o", ms=3, label=short(s),
                            color=color[s])
            ax.axhline(1.0, color="k", lw=0.8)
            ax.set_xscale("log"); ax.set_yscale("log")
            ax.set_title(f"N={n}, {fmt_size(zmax)}: speed-up over dense ring")
            ax.set_xlabel("link rate (Gbit/s)"); ax.set_ylabel("dense time / time")
            ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"Speed-up over the dense ring: {title}" if title else "Speed-up over the dense ring")
    fig.tight_layout()
    fig.savefig(os.path.join(directory, "speedup-vs-rate.png"), dpi=90)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("directory", metavar="DIR", help="a sweep's directory, with its n<N>-<rate>.json records")
    p.add_argument("--model-only", action="store_true", help="write table.md and model.md, no plots")
    args = p.parse_args(argv)
    directory = args.directory
    if not os.path.isdir(directory):
        sys.exit(f"report.py: {directory}: no such directory")
    recs = load(directory)
    if not recs:
        sys.exit(f"report.py: no n*-*.json records in {directory}")
    cells = mean_by(recs)
    write_table(cells, directory)
    write_model(cells, directory)
    if not args.model_only:
        plots(cells, directory, setting(recs))
    print(f"report.py: {len(recs)} records -> {directory}/table.md, model.md, *.png")


if __name__ == "__main__":
    main()
