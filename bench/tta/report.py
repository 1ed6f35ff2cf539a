#!/usr/bin/env python3
"""Time-to-accuracy report of bench/tta/run.sh: DIR/records.jsonl -> DIR.md and DIR.png.

Per link rate and variant (medians over rounds where there are several):
  to target   training wall time (the epochs' time_s minus their eval_s, rank 0's clock)
              until the first epoch whose test accuracy reaches the target; "not reached"
              otherwise
  all epochs  the training wall time of the whole run (the same work for every variant)
  final acc   the last epoch's test accuracy, and its difference to dense ("none")
  MB sent     the gradient bytes rank 0 sent over the whole run (gradcomm's count)
  x bf16      bf16's time to target over the variant's (> 1: faster than the 16-bit baseline)
  auto's choices: what compressor=auto ran per layer at the end (the trainer's log)
"""
import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path


def time_to_target(epochs, target):
    t = 0.0
    for e in epochs:
        t += e["time_s"] - e["eval_s"]
        if e["test_accuracy"] >= target:
            return t
    return None


def train_time(epochs):
    return sum(e["time_s"] - e["eval_s"] for e in epochs)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir")
    ap.add_argument("--target", type=float, default=0.85)
    args = ap.parse_args()
    d = Path(args.dir)
    recs = [json.loads(l) for l in open(d / "records.jsonl") if l.strip()]
    if not recs:
        sys.exit(f"tta/report.py: no records in {d}/records.jsonl")
    cells = defaultdict(list)
    rates, variants = [], []
    for r in recs:
        if r["link_rate"] not in rates:
            rates.append(r["link_rate"])
        if r["variant"] not in variants:
            variants.append(r["variant"])
        cells[(r["link_rate"], r["variant"])].append(r)

    def med(xs):
        xs = [x for x in xs if x is not None]
        return statistics.median(xs) if xs else None

    first = recs[0]
    out = [f"# Time to accuracy: {d.name}", "",
           f"gradcomm-train on the emulated cluster (bench/tta/run.sh; one network namespace per rank, tbf at "
           f"the link rate, 'unshaped': none), {first['cores']} cores, build {first['commit']}. Trainer: "
           f"`{first['train_args']}`, {len(first['epochs'])} epochs; top-k and auto with "
           f"--momentum-correction. Target test accuracy {args.target}. Commands: `{d.name}/commands.txt`.", "",
           "To target: training wall time (evaluation excluded) until the first epoch at or above the target; "
           "the target is checked once per epoch, so a variant whose epoch-2 accuracy lands just above it "
           "reaches it an epoch earlier than one just below (accuracy, not speed). All epochs: the training "
           "wall time of the whole run, the same work for every variant. x bf16: bf16's time over the "
           "variant's. Final acc: the last epoch's, and the difference to dense (`none`) in percentage "
           "points.", ""]
    plot = {}
    for rate in rates:
        out += [f"## {rate}", "",
                "| variant | runs | to target (s) | x bf16 | all epochs (s) | x bf16 | final acc | vs dense (pp) | MB sent "
                "| step (ms, median) |",
                "|---|---|---|---|---|---|---|---|---|---|"]
        dense_acc = med([r["epochs"][-1]["test_accuracy"] for r in cells[(rate, "none")] if r["ok"]])
        bf16_t = med([time_to_target(r["epochs"], args.target) for r in cells[(rate, "bf16")] if r["ok"]])
        bf16_all = med([train_time(r["epochs"]) for r in cells[(rate, "bf16")] if r["ok"]])
        for v in variants:
            runs = [r for r in cells[(rate, v)] if r["ok"]]
            if not runs:
                out.append(f"| `{v}` | 0/{len(cells[(rate, v)])} | failed | | | | | | | |")
                continue
            t = med([time_to_target(r["epochs"], args.target) for r in runs])
            acc = med([r["epochs"][-1]["test_accuracy"] for r in runs])
            sent = med([sum(e["wire_bytes"] for e in r["epochs"]) / 1e6 for r in runs])
            step = med([r["epochs"][-1].get("step_s_median", 0) * 1e3 for r in runs])
            vs = f"{(acc - dense_acc) * 100:+.2f}" if dense_acc is not None else ""
            x = f"{bf16_t / t:.2f}" if (t and bf16_t) else ""
            total = med([train_time(r["epochs"]) for r in runs])
            x_all = f"{bf16_all / total:.2f}" if bf16_all else ""
            out.append(f"| `{v}` | {len(runs)}/{len(cells[(rate, v)])} | "
                       f"{'not reached' if t is None else f'{t:.1f}'} | {x} | {total:.1f} | {x_all} | {acc:.4f} | {vs} | "
                       f"{sent:.1f} | {step:.1f} |")
            plot[(rate, v)] = runs[0]["epochs"]
        autos = [r for r in cells[(rate, "auto")] if r["ok"] and r["epochs"][-1].get("auto_choices")]
        if autos:
            ch = autos[0]["epochs"][-1]["auto_choices"]
            out += ["", "auto's choices at the end: " + ", ".join(f"{k} `{c}`" for k, c in sorted(ch.items()))]
        out.append("")
    (d.parent / f"{d.name}.md").write_text("\n".join(out) + "\n")
    print("\n".join(out))
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("tta/report.py: no matplotlib; no plot", file=sys.stderr)
        return
    fig, axes = plt.subplots(1, len(rates), figsize=(5 * len(rates), 4), squeeze=False)
    for ax, rate in zip(axes[0], rates):
        for v in variants:
            eps = plot.get((rate, v))
            if not eps:
                continue
            t, xs, ys = 0.0, [], []
            for e in eps:
                t += e["time_s"] - e["eval_s"]
                xs.append(t)
                ys.append(e["test_accuracy"])
            ax.plot(xs, ys, marker="o", label=v)
        ax.axhline(args.target, color="gray", linestyle="--", linewidth=1)
        ax.set_title(f"{rate}")
        ax.set_xlabel("training time (s)")
        ax.set_ylabel("test accuracy")
        ax.legend(fontsize=7)
    fig.suptitle(f"Time to accuracy, gradcomm-train, {first['cores']} cores ({d.name})")
    fig.tight_layout()
    fig.savefig(d.parent / f"{d.name}.png", dpi=110)


if __name__ == "__main__":
    main()
