#!/usr/bin/env python3
"""Merges gradcomm-cpu-cost's native JSON with the callgrind dumps of the same binary
into one markdown table and one JSON file (bench/cpu_cost/run.sh calls this).

Each dump was written by CALLGRIND_DUMP_STATS_AT("compressor/phase/n") right after
one execution of that phase, with collection on only during it, so its `totals:`
(or `summary:`) line is that execution's instruction count (Ir)."""
import argparse
import glob
import json
import re


def read_dumps(directory):
    """{tag: Ir} from every callgrind dump in directory."""
    counts = {}
    for path in glob.glob(f"{directory}/cg.*"):
        tag, total = None, None
        with open(path, errors="replace") as f:
            for line in f:
                m = re.match(r"desc: Trigger: Client Request: (.*)$", line)
                if m:
                    tag = m.group(1).strip()
                m = re.match(r"(?:totals|summary): (\d+)", line)
                if m:
                    total = int(m.group(1))
        if tag is not None and total is not None:
            counts[tag] = total
    return counts


def num(v):
    """Three decimals, or three significant digits below 0.01 (tiny sparse phases)."""
    if v == 0 or abs(v) >= 0.01:
        return f"{v:.3f}" if abs(v) < 100 else f"{v:.1f}"
    return f"{v:.2g}"


def size_name(n):
    return f"{n >> 20}M" if n % (1 << 20) == 0 else str(n)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--native", required=True, help="gradcomm-cpu-cost --json of the native run")
    ap.add_argument("--callgrind-dir", required=True)
    ap.add_argument("--md", required=True)
    ap.add_argument("--json", required=True)
    ap.add_argument("--header", default="", help="markdown put above the table")
    a = ap.parse_args()

    native = json.load(open(a.native))
    ir = read_dumps(a.callgrind_dir)
    rows, order = {}, []
    for p in native["phases"]:
        key = (p["compressor"], p["phase"])
        if key not in rows:
            rows[key] = {}
            order.append(key)
        rows[key][p["n"]] = p
    sizes = sorted({p["n"] for p in native["phases"]})
    cg_sizes = sorted({int(t.rsplit("/", 1)[1]) for t in ir})

    def ir_per_elem(c, ph, n):
        t = ir.get(f"{c}/{ph}/{n}")
        return None if t is None else t / n

    head = (["compressor", "phase"] + [f"Ir/e {size_name(n)}" for n in cg_sizes] +
            [f"CPU ns/e {size_name(n)}" for n in sizes] + [f"floor ns/e {size_name(sizes[-1])}",
                                                          f"CPU/floor {size_name(sizes[-1])}", "traffic (bytes)"])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    merged = []
    for c, ph in order:
        by_n = rows[(c, ph)]
        big = by_n[sizes[-1]]
        cells = [c, ph]
        for n in cg_sizes:
            v = ir_per_elem(c, ph, n)
            cells.append("—" if v is None else num(v))
        for n in sizes:
            cells.append(num(by_n[n]["cpu_ns_per_elem"]) if n in by_n else "—")
        fl = big["floor_ns_per_elem"]
        cells += [num(fl), f"{big['cpu_ns_per_elem'] / fl:.1f}" if fl > 0 else "—", big["traffic"]]
        lines.append("| " + " | ".join(cells) + " |")
        for n, p in sorted(by_n.items()):
            q = dict(p)
            q["ir"] = ir.get(f"{c}/{ph}/{n}")
            q["ir_per_elem"] = ir_per_elem(c, ph, n)
            merged.append(q)
        for n in cg_sizes:  # callgrind-only sizes
            if n not in by_n and ir.get(f"{c}/{ph}/{n}") is not None:
                merged.append({"compressor": c, "phase": ph, "n": n, "ir": ir[f"{c}/{ph}/{n}"],
                               "ir_per_elem": ir_per_elem(c, ph, n)})

    notes = ["", "Notes per phase (what is called):", ""]
    for c, ph in order:
        notes.append(f"- `{c}` / `{ph}`: {rows[(c, ph)][sizes[-1]]['note']}")
    notes += ["", "Not measured:", ""] + [f"- {s}" for s in native.get("not_measured", [])]
    with open(a.md, "w") as f:
        if a.header:
            f.write(a.header.rstrip() + "\n\n")
        f.write("\n".join(lines + notes) + "\n")
    out = {k: v for k, v in native.items() if k != "phases"}
    out["callgrind_sizes"] = cg_sizes
    out["phases"] = merged
    with open(a.json, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
