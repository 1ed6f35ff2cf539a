#!/usr/bin/python3
"""The e2e report from bench/e2e/run.sh's records: DIR/records.jsonl -> DIR.md (tables) and
DIR.png (step time per variant per rate). Re-run it on the records at any time:

    /usr/bin/python3 bench/e2e/report.py OUT_DIR   (the folder bench/e2e/run.sh wrote; raw runs are not kept in git)

Per rate and variant: the median over rounds of each run's median step time (a run's step
time: per step, the max over ranks), the range of the per-run medians over rounds, the
speed-up against DDP+gloo and against torch's PowerSGD (t(reference) / t(variant): > 1 is
faster), the time above the compute-alone floor, bytes each rank sent per step, the final
loss; for gradcomm variants the gradcomm.stats() split, for gradcomm-train its own split.
"""
import json
import os
import statistics
import sys
from collections import OrderedDict, defaultdict


def load(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def ms(v, digits=1):
    return "–" if v is None else f"{v * 1e3:.{digits}f}"


def mb(v):
    return "–" if v is None else f"{v / 1e6:.2f}"


def ratio(ref, v):
    return "–" if ref is None or not v else f"{ref / v:.2f}x"


def rate_key(rate):
    units = {"k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}
    digits = rate.lower().rstrip("bitps")
    try:
        return float(digits[:-1]) * units.get(digits[-1], 1) if digits[-1] in units else float(digits)
    except (ValueError, IndexError):
        return 0.0


def summarize(records):
    """{rate: {variant: cell}} with cells in first-seen variant order."""
    groups = defaultdict(lambda: OrderedDict())
    for r in records:
        # Runs of one variant with GRADCOMM_HIERARCHY=off (run.sh --hierarchies) are a row of their own.
        name = r["variant"] + (" (flat)" if r.get("hierarchy") == "off" else "")
        groups[r["link_rate"]].setdefault(name, []).append(r)
    table = {}
    for rate in sorted(groups, key=rate_key):
        table[rate] = OrderedDict()
        for variant, runs in groups[rate].items():
            ok = [r for r in runs if r.get("ok")]
            meds = [r["step_s_median"] for r in ok if r.get("step_s_median") is not None]
            cell = {"runs": len(runs), "ok": len(ok), "median": median(meds),
                    "lo": min(meds) if meds else None, "hi": max(meds) if meds else None,
                    "p90": median([r.get("step_s_p90") for r in ok]),
                    "wire": median([r.get("wire_bytes_per_step") for r in ok]),
                    "loss": median([r.get("final_loss") for r in ok]),
                    "cpu": median([r.get("cpu_s_per_step") for r in ok]),
                    "node_link": median([max(r["node_link_bytes_per_step"]) for r in ok
                                         if r.get("node_link_bytes_per_step")]),
                    "params": ok[0].get("params") if ok else None,
                    "kind": ok[0].get("kind") if ok else None,
                    "acc": [(r.get("seed"), r["test_accuracy"]) for r in ok if r.get("test_accuracy") is not None]}
            phases = [r.get("gradcomm_per_step") for r in ok if r.get("gradcomm_per_step")]
            if phases:
                cell["gradcomm"] = {k: median([p[k] for p in phases]) for k in phases[0]}
            if cell["kind"] == "train":
                for k in ("compute_s_per_step", "compress_s_per_step", "comm_s_per_step"):
                    cell[k] = median([r.get(k) for r in ok])
                cell["overlap"] = ok[0].get("overlap")
                cell["overlap_flag_supported"] = ok[0].get("overlap_flag_supported")
                cell["step_time_source"] = ok[0].get("step_time_source")
            table[rate][variant] = cell
    return table


def markdown(records, table, title):
    first = records[0]
    loads = [r["loadavg_1m"] for r in records if r.get("loadavg_1m") is not None]
    torches = sorted({r["torch"] for r in records if r.get("torch")})
    lines = [f"# {title}", "",
             f"{len(records)} runs ({sum(1 for r in records if r.get('ok'))} ok), {first.get('ranks', '?')} ranks "
             f"(one network namespace each), batch {first.get('batch_size', 64)} per rank, "
             f"{first.get('steps', '?')} timed steps per run, rounds interleaved; build {first.get('commit', '?')} "
             f"({first.get('build', '?')}); torch {', '.join(torches) or '?'}; "
             f"{first.get('cores', '?')} cores shared by all ranks; "
             f"1-min load average at run starts {min(loads):.1f}–{max(loads):.1f}." if loads else "",
             "", "Step time: per step the max over ranks, the run's median of that; the table gives the median "
             "over rounds and the range (min–max) of the per-run medians. ×gloo, ×PowerSGD: t(reference) / "
             "t(variant), > 1 is faster. Over compute: step time minus the `compute` variant's (no "
             "communication, same CPU contention). CPU/rank: a rank's CPU seconds per step (all its threads); "
             "with more ranks than cores a step takes at least ranks × CPU / cores. Comm CPU/param: what the "
             "communication path adds to a rank's CPU per step (CPU/rank minus the `compute` variant's), in "
             "nanoseconds per model parameter. Wire: bytes each rank "
             "sent per step on eth0 (all protocols; gradcomm-train: gradcomm's own count).", ""]
    with_acc = any(c.get("acc") for cells in table.values() for c in cells.values())
    if with_acc:
        lines += [f"Test accuracy (`ddp_step.py --eval`): after the run's last step, on the first "
                  f"{first.get('eval_examples', '?')} test examples, per run as seed: accuracy.", ""]
    for rate, cells in table.items():
        gloo = cells.get("gloo", {}).get("median")
        psgd = cells.get("powersgd", {}).get("median")
        floor = cells.get("compute", {}).get("median")
        lines += [f"## {rate}", "",
                  "| variant | runs ok | step (ms) | range (ms) | p90 (ms) | ×gloo | ×PowerSGD | over compute (ms) "
                  "| CPU/rank (ms) | comm CPU/param (ns) | wire (MB/step) | node link (MB/step) | final loss |"
                  + (" test accuracy |" if with_acc else ""),
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|" + ("---|" if with_acc else "")]
        compute_cpu = cells.get("compute", {}).get("cpu")
        for v, c in cells.items():
            over = "–" if floor is None or c["median"] is None or v == "compute" else ms(c["median"] - floor)
            rng = "–" if c["lo"] is None else f"{ms(c['lo'])}–{ms(c['hi'])}"
            loss = "–" if c["loss"] is None else f"{c['loss']:.3f}"
            params = c.get("params")
            comm_cpu = ("–" if compute_cpu is None or c["cpu"] is None or not params or v == "compute"
                        or c.get("kind") == "train" else f"{(c['cpu'] - compute_cpu) / params * 1e9:.2f}")
            lines.append(f"| `{v}` | {c['ok']}/{c['runs']} | {ms(c['median'])} | {rng} | {ms(c['p90'])} | "
                         f"{ratio(gloo, c['median'])} | {ratio(psgd, c['median'])} | {over} | {ms(c['cpu'])} | {comm_cpu} | {mb(c['wire'])} | "
                         f"{mb(c['node_link'])} | "
                         f"{loss} |" + (f" {', '.join(f'{sd}: {a:.4f}' for sd, a in sorted(c['acc'], key=str))} |"
                                        if with_acc else ""))
        gc = [(v, c) for v, c in cells.items() if "gradcomm" in c]
        if gc:
            lines += ["", "gradcomm.stats() per step and rank (medians over rounds of the per-run means). "
                      "Engine CPU: the CPU time of gradcomm's engine thread, where all of its encode, decode, "
                      "reduction and transport work runs (`engine_cpu_s`); per parameter, the communication "
                      "path's CPU measured directly, not as a difference of two noisy totals:", "",
                      "| variant | inside collectives (ms) | encode | decode | reduce | wire wait | sent (MB) "
                      "| engine CPU (ms) | engine CPU/param (ns) |",
                      "|---|---|---|---|---|---|---|---|---|"]
            for v, c in gc:
                g = c["gradcomm"]
                cpu = g.get("engine_cpu_s")
                per_param = "–" if cpu is None or not c.get("params") else f"{cpu / c['params'] * 1e9:.2f}"
                lines.append(f"| `{v}` | {ms(g['total_s'])} | {ms(g['encode_s'])} | {ms(g['decode_s'])} | "
                             f"{ms(g['reduce_s'])} | {ms(g['comm_s'])} | {mb(g['bytes_sent'])} | {ms(cpu)} | "
                             f"{per_param} |")
        tr = [(v, c) for v, c in cells.items() if c.get("kind") == "train"]
        if tr:
            lines += ["", "gradcomm-train (`topk:ratio=0.01`), per step and rank:", "",
                      "| variant | step (ms) | compute | compress | exposed comm | overlap | step time from |",
                      "|---|---|---|---|---|---|---|"]
            for v, c in tr:
                ov = c["overlap"] if c["overlap"] is not None else (
                    "n/a (no --overlap flag in this build)" if not c["overlap_flag_supported"] else "?")
                lines.append(f"| `{v}` | {ms(c['median'])} | {ms(c['compute_s_per_step'])} | "
                             f"{ms(c['compress_s_per_step'])} | {ms(c['comm_s_per_step'])} | {ov} | "
                             f"{c['step_time_source']} |")
        lines.append("")
    failed = [r for r in records if not r.get("ok")]
    if failed:
        lines += ["## Failed runs", ""] + [f"- `{r['variant']}` at {r['link_rate']}, round {r['round']}"
                                          for r in failed] + [""]
    return "\n".join(lines)


def setting(records):
    """The plot's title from the records: ranks, model size and batch when every run
    agrees on them (a 2-rank sweep is titled 2 ranks)."""
    def shared(key):
        values = {r[key] for r in records if r.get(key) is not None}  # a failed run may lack it
        return values.pop() if len(values) == 1 else None
    ranks, params, batch = shared("ranks"), shared("params"), shared("batch_size")
    parts = []
    if ranks is not None:
        parts.append(f"{ranks} rank" + ("" if ranks == 1 else "s"))
    if params is not None:
        parts.append(f"MLP of {params:,} parameters")
    if batch is not None:
        parts.append(f"batch {batch} per rank")
    return ", ".join(parts)


def plot(table, path, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    variants = list(OrderedDict.fromkeys(v for cells in table.values() for v in cells))
    rates = list(table)
    fig, ax = plt.subplots(figsize=(max(8, 1.1 * len(variants)), 4.5))
    width = 0.8 / max(1, len(rates))
    for i, rate in enumerate(rates):
        xs, ys, err = [], [], [[], []]
        for j, v in enumerate(variants):
            c = table[rate].get(v)
            if c and c["median"] is not None:
                xs.append(j + (i - (len(rates) - 1) / 2) * width)
                ys.append(c["median"] * 1e3)
                err[0].append((c["median"] - c["lo"]) * 1e3)
                err[1].append((c["hi"] - c["median"]) * 1e3)
        ax.bar(xs, ys, width, yerr=err, capsize=3, label=rate)
    ax.set_xticks(range(len(variants)))
    ax.set_xticklabels(variants, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("step time (ms), median over rounds; bars: range")
    ax.set_title(f"DDP step time: {title}" if title else "DDP step time")
    ax.legend(title="per-rank link")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv):
    if len(argv) != 1:
        raise SystemExit("usage: report.py DIR   (DIR/records.jsonl -> DIR.md, DIR.png)")
    d = argv[0].rstrip("/")
    path = os.path.join(d, "records.jsonl")
    if not os.path.isfile(path):
        raise SystemExit(f"report.py: no {path}")
    records = load(path)
    if not records:
        raise SystemExit(f"report.py: {path} is empty")
    table = summarize(records)
    with open(d + ".md", "w") as f:
        f.write(markdown(records, table, f"End-to-end DDP step time: {os.path.basename(d)}") + "\n")
    plot(table, d + ".png", setting(records))
    print(f"report.py: {len(records)} records -> {d}.md, {d}.png", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1:])
