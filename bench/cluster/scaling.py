#!/usr/bin/python3
"""The alpha-beta model of bench/README.md ("When compression pays") carried to large N.

    /usr/bin/python3 bench/cluster/scaling.py [--constants FILE] [--measured DIR]... --out PREFIX

Writes PREFIX.md (time per allreduce against N, crossovers, and with --measured the model
against cluster run records) and PREFIX.png (time against N, log-log, one panel per link rate).
Constants (compute rates measured on the development VM, each with its source) come from
FILE, by default constants-2026-11-24.json next to this script.

Per rank: N ranks, S bytes of fp32 (n = S/4 elements), a link of B bytes/s, alpha seconds
per message, k = round(r*n). Compute terms use one core's measured rates (the CPU code is
single-threaded per rank); R_x below are those rates.

  dense ring     T = 2(N-1)a + max(2(N-1)/N*S/B, (N-1)/N*S/R_reduce)
                 (the pipelined ring reduces a chunk while the next is on the wire)
  compressed     T = 2(N-1)a + W/B + S/R_enc + 2(N-1)/N*S/R_dec,
  ring (b bits)  W = 2(N-1)/N*(S*b/32 + scales), scales = 8*ceil(n/512) bytes for quant.
                 Per rank (src/collectives/compressed_ring.cc): N encodes of a segment
                 (N-1 reduce-scatter sends + the owner's final encode) = S, each with error
                 feedback's decode + loss (inside the measured encode phase); N-1 decode_adds
                 and N-1 decodes = 2(N-1)/N*S. Compute is added to the wire (serial, the
                 README's upper bound), not overlapped.
  top-k payload  P(n,k) = 24 + k*v + idx, v = 4 (fp32) or 2 (bf16, fp16);
                 raw idx = 4k; coded (Elias-Fano) idx = ceil(k*L/8) + ceil((k + ((n-1)>>L))/8),
                 L = floor(log2(floor(n/k))) (compressors/sparse/sparse_code.h).
  allgather      T = (N-1)a + (N-1)*P/B + S/R_sel + (k + N*k)/R_entry + S/R_memset
                 (select, encode own k, zero the output, add N payloads; sizes are not
                 exchanged when select=exact: fixed size; select=sample adds (N-1)a)
  reduce-scatter regions of n/N; a rank sends N-1 region payloads P(n/N, k/N), the owner
  (algo=         sums k entries, keeps c = max(1, ceil(k/N)), allgathers P(n/N, c):
   reduce_scatter) T = 4(N-1)a + (N-1)*P(n/N,k/N)/B + (N-1)*P(n/N,c)/B
                   + S/R_sel + k/R_entry + k/R_merge + (S/N)/R_memset + 4k/R_sel
                   + c/R_entry + N*c/R_entry + S/R_memset
                 4(N-1)a = all-to-all sizes + all-to-all data + allgather sizes + data.
Assumed: full-bisection network, every rank's link at B in each direction, no contention,
alpha charged per message on the sender, the all-to-all's messages serialized on the
sender's link, a top-k selection spread evenly over the regions, no stragglers.

--measured DIR (repeatable): bench/cluster/run.sh records DIR/n<N>-<rate>.json. gradcomm
records at 100 MiB (else the largest size) are matched by compressor: 'none' = dense ring, a
spec in ring_codecs, or topk:ratio=r: algo=reduce_scatter -> reduce-scatter, algo=allgather ->
allgather, indices=raw -> raw, another indices= -> coded, values= as given. What the spec
leaves open (algo=auto or none, no indices=, no values=) is the candidate (allgather or
reduce-scatter; raw or coded; fp32 or bf16) whose wire bytes per rank come closest to the
record's: records made before the coded default are raw fp32 allgathers, newer ones bf16
coded. Without wire bytes, a spec with none of algo=, indices=, values= counts as old (raw,
fp32, allgather), any other as coded (bf16 unless values= says). Those cells use the record's
link rate and alpha_measured_s; a second column scales compute by max(1, N/cores), the
emulation's ranks sharing the VM's cores.
"""
import argparse
import glob
import json
import math
import os
import re
import shlex
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
GBIT = 1e9 / 8


def val(x):
    return x["value"] if isinstance(x, dict) else x


class Model:
    def __init__(self, c):
        self.c = c
        self.S = val(c["size_bytes"])
        self.n = self.S // 4
        self.r_reduce = val(c["reduce_bytes_per_s"])
        self.r_mem = val(c["memset_bytes_per_s"])
        self.r_entry = {False: val(c["sparse_decode_entries_per_s"]), True: val(c["coded_decode_entries_per_s"])}
        self.r_merge = val(c["owner_merge_entries_per_s"])

    # Each method returns (seconds, wire bytes sent per rank); cs scales compute (shared cores).
    def dense(self, N, B, a, cs=1.0):
        S = self.S
        wire = 2 * (N - 1) / N * S
        return 2 * (N - 1) * a + max(wire / B, cs * (N - 1) / N * S / self.r_reduce), wire

    def ring(self, spec, N, B, a, cs=1.0):
        cd = self.c["ring_codecs"][spec]
        S, n = self.S, self.n
        scales = cd["bucket_bytes"] * math.ceil(n / cd["bucket"]) if cd["bucket"] else 0
        wire = 2 * (N - 1) / N * (S * cd["bits"] / 32 + scales)
        comp = S / cd["encode_bytes_per_s"] + 2 * (N - 1) / N * S / cd["decode_bytes_per_s"]
        return 2 * (N - 1) * a + wire / B + cs * comp, wire

    @staticmethod
    def payload(n, k, coded, vbytes):
        n, k = int(n), max(0, int(round(k)))
        if k == 0:
            return 24
        if coded:
            L = (n // k).bit_length() - 1
            idx = math.ceil(k * L / 8) + math.ceil((k + ((n - 1) >> L)) / 8)
        else:
            idx = k * (4 if n < 2**32 else 8)
        return 24 + k * vbytes + idx

    def k_of(self, r):
        return max(1, round(r * self.n))

    def r_sel(self, r, select):
        return val(self.c["topk_select_bytes_per_s"][select][f"{r:g}"])

    def allgather(self, N, B, a, r, coded, vbytes, select="exact", cs=1.0):
        S, k = self.S, self.k_of(r)
        P = self.payload(self.n, k, coded, vbytes)
        lat = (N - 1) * a * (1 if select == "exact" else 2)
        comp = S / self.r_sel(r, select) + (k + N * k) / self.r_entry[coded] + S / self.r_mem
        return lat + (N - 1) * P / B + cs * comp, (N - 1) * P

    def reduce_scatter(self, N, B, a, r, coded, vbytes, select="exact", cs=1.0):
        S, n, k = self.S, self.n, self.k_of(r)
        kept = max(1, math.ceil(k / N))
        p_out = self.payload(n / N, k / N, coded, vbytes)
        p_kept = self.payload(n / N, kept, coded, vbytes)
        e = self.r_entry[coded]
        comp = (S / self.r_sel(r, select) + k / e          # select, split into region payloads
                + k / self.r_merge + S / N / self.r_mem     # owner: decode + sum its region
                + 4 * k / self.r_sel(r, select) + kept / e   # keep ceil(k/N), encode them
                + N * kept / e + S / self.r_mem)            # decode all regions into the output
        wire = (N - 1) * (p_out + p_kept)
        return 4 * (N - 1) * a + wire / B + cs * comp, wire


# The scaling table's algorithms: label -> f(model, N, B, alpha) -> seconds.
def algorithms():
    algos = {
        "dense ring": lambda m, N, B, a: m.dense(N, B, a)[0],
        "quant:bits=4 ring": lambda m, N, B, a: m.ring("quant:bits=4", N, B, a)[0],
        "fp16 ring": lambda m, N, B, a: m.ring("fp16", N, B, a)[0],
    }
    for r, pct in ((0.01, "1%"), (0.001, "0.1%")):
        algos[f"topk {pct} AG raw"] = lambda m, N, B, a, r=r: m.allgather(N, B, a, r, False, 4)[0]
        algos[f"topk {pct} AG coded"] = lambda m, N, B, a, r=r: m.allgather(N, B, a, r, True, 2)[0]
        algos[f"topk {pct} RS coded"] = lambda m, N, B, a, r=r: m.reduce_scatter(N, B, a, r, True, 2)[0]
    return algos


DENSE_GROUP = ["dense ring", "quant:bits=4 ring", "fp16 ring"]
GROUPS = {pct: DENSE_GROUP + [f"topk {pct} AG raw", f"topk {pct} AG coded", f"topk {pct} RS coded"]
          for pct in ("1%", "0.1%")}
PLOTTED = ["dense ring", "quant:bits=4 ring", "topk 1% AG raw", "topk 1% AG coded", "topk 1% RS coded"]


def ranges(ns):
    """[2, 4, 8, 64] -> '2-8, 64' (consecutive in the grid of powers of two)."""
    out, run = [], []
    for x in ns:
        if run and x != run[-1] * 2:
            out.append(run)
            run = []
        run.append(x)
    if run:
        out.append(run)
    return ", ".join(f"{r[0]}" if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in out)


def first_from(pred, ns):
    """Smallest N in ns from which pred holds for every larger N in ns; None if not at the end."""
    found = None
    for N in reversed(ns):
        if not pred(N):
            break
        found = N
    return found


def scaling_sections(m, c):
    algos = algorithms()
    Ns = c["ranks"]
    lines = []
    combos = [(g, a) for g in c["link_rates_gbit"] for a in c["alphas_us"]]
    for g, a_us in combos:
        B, a = g * GBIT, a_us * 1e-6
        lines += [f"### {g} Gbit/s, alpha = {a_us} us", "",
                  "| N | " + " | ".join(algos) + " | fastest (1%) | fastest (0.1%) |",
                  "|---" * (len(algos) + 3) + "|"]
        for N in Ns:
            t = {name: f(m, N, B, a) for name, f in algos.items()}
            best = {p: min(GROUPS[p], key=t.get) for p in GROUPS}
            lines.append(f"| {N} | " + " | ".join(f"{t[x] * 1e3:.1f}" for x in algos) +
                         f" | {best['1%']} | {best['0.1%']} |")
        lines.append("")

    # Crossovers: one column per (rate, alpha).
    big = list(range(2, 16385))
    head = "| | " + " | ".join(f"{g} Gbit/s, {a} us" for g, a in combos) + " |"
    rows = {}
    for g, a_us in combos:
        B, a = g * GBIT, a_us * 1e-6
        T = {name: {N: f(m, N, B, a) for N in Ns} for name, f in algos.items()}
        for p, group in GROUPS.items():
            for name in group:
                fastest = [N for N in Ns if min(group, key=lambda x: T[x][N]) == name]
                start = first_from(lambda N: N in fastest, Ns)
                cell = f"N >= {start}" if start else "never"
                if fastest and not start:
                    cell += f" (fastest at {ranges(fastest)})"
                elif fastest and start != fastest[0]:
                    cell += f" (also {ranges([x for x in fastest if x < start])})"
                rows.setdefault(f"fastest among the {p} group: {name}", []).append(cell)

        def integer_cross(f1, f2):
            """The integer N in big where f1 > f2, as ranges: '77+' = from 77 to the scan's end."""
            spans, lo = [], None
            for N in big + [None]:
                hit = N is not None and f1(m, N, B, a) > f2(m, N, B, a)
                if hit and lo is None:
                    lo = N
                elif not hit and lo is not None:
                    spans.append((lo, prev))
                    lo = None
                prev = N
            if not spans:
                return f"never (to {big[-1]})"
            if spans == [(big[0], big[-1])]:
                return "always"
            return ", ".join(f"{x}+" if y == big[-1] else f"{x}-{y}" for x, y in spans)
        for pct in ("1%", "0.1%"):
            for fmt in ("raw", "coded"):
                rows.setdefault(f"topk {pct} AG {fmt} slower than dense ring at N =", []).append(
                    integer_cross(algos[f"topk {pct} AG {fmt}"], algos["dense ring"]))
            rows.setdefault(f"topk {pct} RS coded faster than AG coded at N =", []).append(
                integer_cross(algos[f"topk {pct} AG coded"], algos[f"topk {pct} RS coded"]))
            rows.setdefault(f"topk {pct} RS coded faster than AG raw at N =", []).append(
                integer_cross(algos[f"topk {pct} AG raw"], algos[f"topk {pct} RS coded"]))
            rows.setdefault(f"topk {pct} RS coded slower than dense ring at N =", []).append(
                integer_cross(algos[f"topk {pct} RS coded"], algos["dense ring"]))
    lines += ["## Crossovers", "",
              "\"fastest\": over the grid N = " + ", ".join(map(str, Ns)) + ", within a group (the dense",
              "algorithms and the three top-k variants of one ratio; the two ratios are different",
              "compressions). \"N >= x\": fastest at x and every larger N of the grid. The \"at N =\" rows",
              "scan every integer N from 2 to 16384 and give the ranges where the statement holds",
              "(\"77+\": from 77 to 16384).", "", head, "|---" * (len(combos) + 1) + "|"]
    lines += [f"| {k} | " + " | ".join(v) + " |" for k, v in rows.items()]
    return lines


# --- measured records --------------------------------------------------------------------

def rate_bytes(rate):
    mm = re.fullmatch(r"([0-9.]+)([kmgt]?)bit", rate)
    return float(mm[1]) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}[mm[2]] / 8


def parse_spec(spec):
    name, _, rest = spec.partition(":")
    return name, dict(p.split("=", 1) for p in rest.split(",") if "=" in p)


def library_auto_choice(n, r, N, coded, vbytes):
    """algo=auto as src/collectives/sparse_allreduce.cc decides it: alpha 30 us, 10 Gbit/s,
    70 ns per entry the owner receives (fixed constants, not the record's link)."""
    if N <= 2:
        return "allgather"
    alpha, B, owner = 30e-6, 10e9 / 8, 70e-9
    k = max(1, round(r * n))
    P = Model.payload(n, k, coded, vbytes)
    kept = Model.payload(math.ceil(n / N), math.ceil(k / N), coded, vbytes)
    ag = (N - 1) * alpha + (N - 1) * P / B
    rs = 4 * (N - 1) * alpha + ((N - 1) / N * P + (N - 1) * kept) / B + k * owner
    return "reduce_scatter" if rs < ag else "allgather"


def model_record(m, rec, cs):
    """(seconds, label) for a record, or None when the model has no form for its compressor."""
    N, B, a = rec["ranks"], rate_bytes(rec["link_rate"]), val(m.c["alpha_measured_s"])
    spec = rec["compressor"]
    if spec == "none":
        return m.dense(N, B, a, cs)[0], "dense ring"
    if spec in m.c["ring_codecs"]:
        return m.ring(spec, N, B, a, cs)[0], f"{spec} ring"
    name, p = parse_spec(spec)
    if name != "topk" or "ratio" not in p:
        return None
    r, select = float(p["ratio"]), p.get("select", "exact")
    if f"{r:g}" not in m.c["topk_select_bytes_per_s"].get(select, {}):
        return None
    vb = {"fp32": 4, "fp16": 2, "bf16": 2}
    algo = p.get("algo", "auto")
    if algo == "auto":  # what the library chose (records before algo= existed: the allgather)
        algo = library_auto_choice(m.n, r, N, p.get("indices", "coded") != "raw", vb[p.get("values", "bf16")])
    algos = [m.reduce_scatter] if algo == "reduce_scatter" else [m.allgather]
    cands = [(f, coded, v) for f in algos
             for coded in ([p["indices"] != "raw"] if "indices" in p else [False, True])
             for v in ([p["values"]] if "values" in p else ["fp32", "bf16"])]
    how = ""
    if len(cands) > 1 and rec.get("wire_bytes"):  # what the spec leaves open: the closest wire bytes
        cands.sort(key=lambda x: abs(x[0](N, B, a, r, x[1], vb[x[2]], select)[1] - rec["wire_bytes"]))
        how = " (by wire bytes)"
    elif len(cands) > 1:  # no wire bytes: a spec without indices=, values=, algo= is an old, raw one
        old = not any(x in p for x in ("indices", "values", "algo"))
        coded = p["indices"] != "raw" if "indices" in p else not old
        cands = [(algos[0], coded, p.get("values", "fp32" if old else "bf16"))]
    f, coded, values = cands[0]
    kind = "RS" if f == m.reduce_scatter else "AG"
    return f(N, B, a, r, coded, vb[values], select, cs)[0], f"topk {kind} {'coded' if coded else 'raw'} {values}{how}"


def measured_section(m, dirs):
    notes, rows, skipped = [], [], set()
    for d in dirs:
        recs = []
        for path in sorted(glob.glob(os.path.join(d, "n*-*.json"))):
            recs += [r for r in json.load(open(path)) if r.get("impl") == "gradcomm"]
        if not recs:
            sys.exit(f"scaling.py: no gradcomm records in {d}/n*-*.json")
        name = os.path.basename(os.path.normpath(d))
        info = os.path.join(d, "sweep-info.txt")
        if os.path.exists(info):
            head = [x.strip() for x in open(info) if x.startswith(("date:", "commit:"))]
            notes.append(f"- `{name}` ({d}): {', '.join(head)}, from its sweep-info.txt.")
        sizes = {r["size_bytes"] for r in recs}
        size = m.S if m.S in sizes else max(sizes)
        cells = {}
        for r in recs:
            if r["size_bytes"] == size:
                cells.setdefault((r["ranks"], rate_bytes(r["link_rate"]), r["link_rate"], r["compressor"]), []).append(r)
        mm = Model(dict(m.c, size_bytes=size))
        for (N, _, rate, spec), rs in sorted(cells.items()):
            rec = dict(rs[0], wire_bytes=sum(x.get("wire_bytes") or 0 for x in rs) / len(rs))
            own, shared = model_record(mm, rec, 1.0), model_record(mm, rec, max(1.0, N / val(m.c["cores_measured"])))
            if own is None:
                skipped.add(spec)
                continue
            t = sum(x["time_us"] for x in rs) / len(rs) / 1e3
            rows.append(f"| {name} | {N} | {rate} | {size / 2**20:g} MiB | `{spec}` | {own[1]} | {t:.1f} | "
                        f"{own[0] * 1e3:.1f} | {shared[0] * 1e3:.1f} | {t / (shared[0] * 1e3):.2f} |")
    lines = ["## Model vs measured (emulated cluster on this VM)", "",
             f"alpha = {val(m.c['alpha_measured_s']) * 1e6:.0f} us, B = the record's link rate. \"model\": one core per",
             "rank, as in the tables above; \"shared\": compute times max(1, N/2), the VM's 2 cores shared by",
             "N ranks. Measured: gradcomm-bench's time per allreduce (mean over records of a cell). Above",
             "1 Gbit/s the emulated links carry about 6 Gbit/s (cluster-2026-11-23.md), so the",
             "wire-bound cells there measure slower than any model at the nominal rate. The compute",
             "constants come from the commits named in the constants table; records made before those",
             "commits ran slower code.", ""] + notes + ["",
             "| records | N | rate | size | compressor | modelled as | measured (ms) | model (ms) | shared (ms) | measured / shared |",
             "|---|---|---|---|---|---|---|---|---|---|"] + rows + [""]
    if skipped:
        lines += ["Not modelled (no constants): " + ", ".join(f"`{s}`" for s in sorted(skipped)) + ".", ""]
    return lines


# --- two levels (two_level_model.py) --------------------------------------------------------

# Inside a node of the large table: an NVLink-class fabric (H100: 450 GB/s per GPU each way;
# counted at a third, for the protocol and the reductions' own traffic), alpha 5 us.
NVLINK_BYTES_PER_S = 150e9
NVLINK_ALPHA_S = 5e-6


def two_level_sections(c, measured):
    sys.path.insert(0, HERE)
    import two_level_model as tlm
    m = Model(c)
    tl = tlm.TwoLevels(m, NVLINK_BYTES_PER_S, NVLINK_ALPHA_S)
    lines = ["## Two levels: flat against hierarchical, ring against direct", "",
             f"`two_level_model.py` (its docstring has the formulas). {m.S / 2**20:g} MiB fp32, 8 ranks per node,",
             "one link per node between nodes, an NVLink-class fabric inside (150 GB/s each way per rank,",
             "alpha 5 us), compute at one core of the development VM per rank. Times in ms; q4 =",
             "quant:bits=4; its error column: the relative error of the sum, flat ring over N ranks against",
             "the direct schedule across the nodes (inside is exact).", ""]
    Ns = [x for x in c["ranks"] if x >= 16]  # at least two nodes of 8
    for gbit in (25, 100):
        lines += tlm.table(tl, Ns, 8, gbit, c["alpha_plot_us"])
    if measured:
        lines += two_level_measured(c, tlm, measured)
    return lines


def two_level_measured(c, tlm, files):
    """The model's time for each bench/cluster/run.sh --nodes record beside the measured one."""
    rows, errs = [], []
    cores = val(c["cores_measured"])
    for path in files:
        for r in json.load(open(path)):
            if r.get("impl") != "gradcomm":
                continue
            mm = Model(dict(c, size_bytes=r["size_bytes"]))
            # Inside a node of the emulation: shared memory on the VM, a copy at its memset rate.
            tl = tlm.TwoLevels(mm, mm.r_mem, 10e-6)
            t = tlm.predict_record(tl, r, cores)
            if t is None:
                continue
            meas = r["time_us"] / 1e6
            errs.append(abs(t - meas) / meas)
            links = r.get("node_link_bytes_per_call") or []
            rows.append(f"| {os.path.basename(path)} | {r.get('nodes', '?')} x {r.get('ranks_per_node', '?')} | "
                        f"{r['link_rate']} | {r['size_bytes'] / 2**20:g} MiB | `{r['compressor']}` | "
                        f"{'flat' if r.get('hierarchy') == 'off' else 'two levels'} | {r.get('schedule', 'auto')} | "
                        f"{meas * 1e3:.1f} | {t * 1e3:.1f} | {t / meas:.2f} | "
                        f"{max(links) / 1e6 if links else float('nan'):.2f} |")
    lines = ["### The two-level model against the emulated cluster (M x L <= 8)", "",
             "Each record of `bench/cluster/run.sh --nodes M --ranks-per-node L` (this VM's 2 cores shared by",
             "all ranks: compute counted max(1, N/2) times; inside a node, shared memory at the VM's copy",
             "rate), the model's time beside it. Node link: MB each node put on its link per call.", "",
             "| records | M x L | rate | size | compressor | schedule | codec schedule | measured (ms) | model (ms) "
             "| model / measured | node link (MB) |", "|---|---|---|---|---|---|---|---|---|---|---|"] + rows
    if errs:
        lines += ["", f"Model error over {len(errs)} records: median {sorted(errs)[len(errs) // 2] * 100:.0f} %, "
                      f"largest {max(errs) * 100:.0f} %.", ""]
    return lines


# --- outputs -----------------------------------------------------------------------------

def constants_section(c, path):
    lines = [f"## Constants (`{os.path.relpath(path)}`)", "", "| constant | value | source |", "|---|---|---|"]

    def row(name, x):
        lines.append(f"| {name} | {val(x):.4g} | {x['source'] if isinstance(x, dict) else ''} |")
    for key in ("alpha_measured_s", "reduce_bytes_per_s", "memset_bytes_per_s", "sparse_decode_entries_per_s",
                "coded_decode_entries_per_s", "owner_merge_entries_per_s"):
        row(key, c[key])
    for spec, k in c["ring_codecs"].items():
        lines.append(f"| `{spec}` encode / decode (B/s) | {k['encode_bytes_per_s']:.4g} / {k['decode_bytes_per_s']:.4g} | {k['source']} |")
    for sel, d in c["topk_select_bytes_per_s"].items():
        for r, x in d.items():
            row(f"top-k select={sel} ratio={r} (B/s)", x)
    return lines + [""]


def plot(m, c, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    algos, Ns = algorithms(), c["ranks"]
    lo, hi = min(c["alphas_us"]), max(c["alphas_us"])
    fig, axes = plt.subplots(1, len(c["link_rates_gbit"]), figsize=(6 * len(c["link_rates_gbit"]), 4.6), squeeze=False)
    for ax, g in zip(axes[0], c["link_rates_gbit"]):
        for i, name in enumerate(PLOTTED):
            col = plt.get_cmap("tab10").colors[i]
            ys = {a: [algos[name](m, N, g * GBIT, a * 1e-6) * 1e3 for N in Ns] for a in (lo, c["alpha_plot_us"], hi)}
            ax.plot(Ns, ys[c["alpha_plot_us"]], "-", marker="o", ms=3, color=col, label=name)
            ax.fill_between(Ns, ys[lo], ys[hi], color=col, alpha=0.18, lw=0)
        ax.set_xscale("log", base=2)
        ax.set_xticks(Ns, [str(N) for N in Ns])
        ax.set_yscale("log")
        ax.set_title(f"{g} Gbit/s per rank, {m.S / 2**20:g} MiB fp32")
        ax.set_xlabel("ranks N")
        ax.set_ylabel("time per allreduce (ms), model")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend(fontsize=8, title=f"alpha = {c['alpha_plot_us']} us; band {lo}-{hi} us", title_fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--constants", default=os.path.join(HERE, "constants-2026-11-24.json"))
    ap.add_argument("--measured", action="append", default=[], metavar="DIR")
    ap.add_argument("--two-levels", action="store_true",
                    help="add the model over two levels (two_level_model.py): flat against two levels, ring "
                         "against direct, to 1,024 ranks at 8 per node")
    ap.add_argument("--measured-nodes", action="append", default=[], metavar="FILE",
                    help="bench/cluster/run.sh --nodes records (JSON) to set beside the two-level model")
    ap.add_argument("--out", required=True, metavar="PREFIX")
    args = ap.parse_args()
    c = json.load(open(args.constants))
    m = Model(c)
    cmd = " ".join(shlex.quote(x) for x in ["/usr/bin/python3"] + sys.argv)
    lines = [f"# Scaling with N: the alpha-beta model, {m.S / 2**20:g} MiB allreduce", "",
             "Produced by", "", f"    {cmd}", "",
             "Model and assumptions: the docstring of `bench/cluster/scaling.py` and `bench/README.md`",
             "(\"Scaling with N\"). Full-bisection network, each rank's link at B both ways, no contention,",
             "alpha per message on the sender, compute at one core of the development VM per rank",
             "(the CPU implementation; a GPU's kernels would shrink every compute term). Times in ms.",
             "Columns: AG = sparse allgather, RS = sparse reduce-scatter (`algo=reduce_scatter`); raw =",
             "u32 index + fp32 value, coded = Elias-Fano indices + bf16 values; top-k select=exact.",
             "Dense ring: its reduce overlaps the wire (max of the two); compressed rings and top-k: compute",
             "is added to the wire time (compressed ring: S encoded and 2(N-1)/N*S decoded per rank).", ""]
    lines += constants_section(c, args.constants)
    lines += ["## Time per allreduce (ms) against N", ""]
    lines += scaling_sections(m, c)
    lines.append("")
    if args.measured:
        lines += measured_section(m, args.measured)
    if args.two_levels or args.measured_nodes:
        lines += two_level_sections(c, args.measured_nodes)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    open(args.out + ".md", "w").write("\n".join(lines) + "\n")
    plot(m, c, args.out + ".png")
    print(f"scaling.py: wrote {args.out}.md, {args.out}.png")


if __name__ == "__main__":
    main()
