#!/usr/bin/python3
"""Compression vs accuracy: gradcomm-train on Fashion-MNIST, one run per compressor.

Runs every configuration below with `gradcomm-run -n RANKS -- gradcomm-train ...`
(same hyper-parameters for all; only the compressor spec and momentum correction
change), then writes, under --out (default: the current directory):

  training-cpu-DATE.csv   one row per run: final test accuracy, gradient bytes per
                          step (this rank's wire bytes), dense bytes, savings, times
  training-cpu-DATE.png   left: final accuracy vs gradient bytes per step (log x);
                          right: test accuracy per epoch per compressor
  training-cpu-DATE.md    the table, the settings and the exact commands
  training-cpu-DATE/      each run's JSON-lines log and console output

Usage:
  /usr/bin/python3 bench/experiments.py --build build --out /tmp/mine
  /usr/bin/python3 bench/experiments.py --only none,topk-1% --epochs 2 --out runs
  /usr/bin/python3 bench/experiments.py --out mine a.jsonl b.jsonl    (your own logs)
The tools come from --build DIR (DIR/tools/gradcomm-run, DIR/trainer/gradcomm-train),
else from ./build when it has them, else from PATH (an installed gradcomm). Given LOG
files (`gradcomm-train --log` output), nothing is run: each log is one row, named
after its file. Runs are sequential (the 2-core machine has no room for two 4-rank
jobs). Every run starts afresh; --reuse keeps a finished log already in the output
directory instead (for resuming an interrupted sweep). To regenerate the committed
tables, name their directory: --out bench/results --date 2026-11-22 --reuse.
"""
import argparse
import csv
import json
import datetime
import os
import shlex
import shutil
import subprocess
import sys
import time

# Shared by every run. Per-rank batch 32 on 4 ranks = effective batch 128.
COMMON = ["--epochs", "{epochs}", "--batch-size", "32", "--lr", "{lr}", "--momentum", "0.9",
          "--warmup-epochs", "0.5", "--lr-schedule", "cosine", "--hidden", "512,256", "--seed", "1"]

# min_numel=1024 keeps the biases (512, 256, 10 elements) dense for every compressor.
# The sketch's table (3 x 4096) is larger than fc3.weight (2560), so it keeps that
# one dense too (min_numel=16384): sketching a tensor into a bigger table saves nothing.
RUNS = [
    ("none", "none", False),
    ("fp16", "fp16:min_numel=1024", False),
    ("quant-8bit", "quant:bits=8,min_numel=1024", False),
    ("quant-4bit", "quant:bits=4,min_numel=1024", False),
    ("quant-2bit", "quant:bits=2,min_numel=1024", False),
    ("qsgd", "qsgd:levels=16,bucket=512,min_numel=1024", False),
    ("sign", "sign:bucket=512,min_numel=1024", False),
    ("topk-1%", "topk:ratio=0.01,min_numel=1024", False),
    ("topk-1%+mc", "topk:ratio=0.01,min_numel=1024", True),
    ("topk-0.1%", "topk:ratio=0.001,min_numel=1024", False),
    ("topk-0.1%+mc", "topk:ratio=0.001,min_numel=1024", True),
    ("randomk-1%", "randomk:ratio=0.01,min_numel=1024", False),
    ("randomk-1%+mc", "randomk:ratio=0.01,min_numel=1024", True),
    ("sketch", "sketch:rows=3,cols=4096,ratio=0.01,min_numel=16384", False),
    ("sketch+mc", "sketch:rows=3,cols=4096,ratio=0.01,min_numel=16384", True),
]


def find_tools(build):
    """(gradcomm-run, gradcomm-train): from the build directory named, else ./build,
    else PATH. Exits with advice that fits the case when they are not there."""
    if build:
        tools = [os.path.join(build, "tools", "gradcomm-run"), os.path.join(build, "trainer", "gradcomm-train")]
        missing = [t for t in tools if not os.access(t, os.X_OK)]
        if missing:
            sys.exit(f"experiments.py: {', '.join(missing)} not found; build them first "
                     f"(cmake --build {build} --target gradcomm-run gradcomm-train)")
        return tools
    local = [os.path.join("build", "tools", "gradcomm-run"), os.path.join("build", "trainer", "gradcomm-train")]
    if all(os.access(t, os.X_OK) for t in local):
        return local
    found = [shutil.which("gradcomm-run"), shutil.which("gradcomm-train")]
    if None in found:
        sys.exit("experiments.py: gradcomm-run and gradcomm-train are neither in ./build nor on PATH; add an "
                 "installed gradcomm's bin directory to PATH, or pass --build DIR (a build tree)")
    return found


def command_for(args, spec, mc, log):
    cmd = [args.tools[0], "-n", str(args.ranks), "--", args.tools[1]]
    cmd += [a.format(epochs=args.epochs, lr=args.lr) for a in COMMON]
    cmd += ["--compressor", spec, "--log", log]
    if mc:
        cmd.append("--momentum-correction")
    return cmd


def read_log(path):
    """The epoch records of a gradcomm-train --log file; a clear exit naming the file
    and line for anything else."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError as e:
        sys.exit(f"experiments.py: {path}: cannot read: {e.strerror}")
    lines = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            sys.exit(f"experiments.py: {path}:{number}: not JSON ({e.msg})")
        if not isinstance(rec, dict):
            sys.exit(f"experiments.py: {path}:{number}: not a JSON object (a gradcomm-train --log line)")
        if "epoch" not in rec:
            continue  # the run's settings, not an epoch
        missing = [k for k in ("test_accuracy", "train_loss", "wire_bytes", "dense_bytes", "steps", "time_s")
                   if k not in rec]
        if missing:
            sys.exit(f"experiments.py: {path}:{number}: epoch record without {', '.join(missing)}")
        lines.append(rec)
    return lines


def run_one(args, name, spec, mc, logdir):
    log = os.path.join(logdir, name.replace("%", "pct") + ".jsonl")
    cmd = command_for(args, spec, mc, log)
    out_path = log.replace(".jsonl", ".out")
    if args.reuse and os.path.exists(log) and len(read_log(log)) == args.epochs:
        print(f"[{name}] reusing {log}", flush=True)
        return cmd, read_log(log), "ok"
    if args.reuse and os.path.exists(out_path + ".failed"):
        print(f"[{name}] reusing failed run {out_path}", flush=True)
        return cmd, read_log(log) if os.path.exists(log) else [], open(out_path + ".failed").read().strip()
    print(f"[{name}] {shlex.join(cmd)}", flush=True)
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    start = time.time()
    for stale in (log, out_path + ".failed"):  # a fresh run: nothing of an earlier one is read back
        if os.path.exists(stale):
            os.remove(stale)
    with open(out_path, "w") as out:
        rc = subprocess.call(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    lines = read_log(log) if os.path.exists(log) else []
    if rc != 0:
        # A diverged run (--nan abort) is a result too: keep its reason for the table.
        reason = next((l.split("error (InvalidArgument): ", 1)[1].split(";")[0] for l in open(out_path)
                       if "error (" in l), f"exit code {rc}")
        with open(out_path + ".failed", "w") as f:
            f.write(f"failed: {reason}\n")
        print(f"[{name}] failed: {reason}", flush=True)
        return cmd, lines, f"failed: {reason}"
    print(f"[{name}] {time.time() - start:.0f} s: accuracy {lines[-1]['test_accuracy']:.4f}", flush=True)
    return cmd, lines, "ok"


def summarize(name, spec, mc, lines, status):
    if not lines:
        nan = float("nan")
        return {"name": name, "compressor": spec, "momentum_correction": int(mc), "status": status,
                "final_test_accuracy": nan, "best_test_accuracy": nan, "final_train_loss": nan,
                "wire_bytes_per_step": nan, "dense_bytes_per_step": nan, "savings_x": nan, "time_s": nan,
                "compute_s": nan, "compress_s": nan, "comm_s": nan, "accuracy_per_epoch": []}
    steps = sum(l["steps"] - l["skipped_steps"] for l in lines)
    wire = sum(l["wire_bytes"] for l in lines)
    dense = sum(l["dense_bytes"] for l in lines)
    return {
        "name": name, "compressor": spec, "momentum_correction": int(mc), "status": status,
        "final_test_accuracy": lines[-1]["test_accuracy"],
        "best_test_accuracy": max(l["test_accuracy"] for l in lines),
        "final_train_loss": lines[-1]["train_loss"],
        "wire_bytes_per_step": wire / steps if steps else float("nan"),
        "dense_bytes_per_step": dense / steps if steps else float("nan"),
        "savings_x": dense / wire if wire else float("nan"),
        "time_s": sum(l["time_s"] for l in lines), "compute_s": sum(l["compute_s"] for l in lines),
        "compress_s": sum(l["compress_s"] for l in lines), "comm_s": sum(l["comm_s"] for l in lines),
        "accuracy_per_epoch": [l["test_accuracy"] for l in lines],
    }


def describe(logs):
    """What the runs were, from their records: "2 ranks" (or "2-4 ranks")."""
    sizes = sorted({l["world_size"] for lines in logs for l in lines if "world_size" in l})
    if not sizes:
        return ""
    n = f"{sizes[0]}" if len(sizes) == 1 else f"{sizes[0]}-{sizes[-1]}"
    return f"{n} rank" + ("" if sizes == [1] else "s")


def plot(rows, path, what):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (left, right) = plt.subplots(1, 2, figsize=(14, 5.5))
    colors = plt.get_cmap("tab20").colors
    # Runs that end below `low` (diverged) sit on the axis, marked with a triangle;
    # low is 80 % unless a run that did not diverge (> 50 %) ends lower.
    finals = [100 * r["final_test_accuracy"] for r in rows if r["accuracy_per_epoch"]]
    low = min([80.0] + [a - 1 for a in finals if a > 50])
    per_epoch = [100 * a for r in rows for a in r["accuracy_per_epoch"]]
    high = max([low + 1] + per_epoch) + 1
    for i, r in enumerate(rows):
        if not r["accuracy_per_epoch"]:
            continue
        acc = 100 * r["final_test_accuracy"]
        shown = max(acc, low + 0.3)
        left.scatter(r["wire_bytes_per_step"], shown, s=30, color=colors[i % 20], marker="o" if acc >= low else "v")
        label = r["name"] if acc >= low else f"{r['name']} ({acc:.0f} %)"
        left.annotate(label, (r["wire_bytes_per_step"], shown), textcoords="offset points",
                      xytext=(4, 4 if i % 2 else -10), fontsize=7)
        right.plot(range(1, len(r["accuracy_per_epoch"]) + 1), [100 * a for a in r["accuracy_per_epoch"]],
                   marker=".", label=r["name"], color=colors[i % 20])
    dense = next((r for r in rows if r["compressor"] == "none" and not r["momentum_correction"]), None)
    if dense:
        left.axhline(100 * dense["final_test_accuracy"], color="grey", lw=0.8, ls="--", label="dense")
        left.axhline(100 * dense["final_test_accuracy"] - 1, color="grey", lw=0.8, ls=":", label="dense - 1 pp")
        left.legend(fontsize=8)
    left.set_xscale("log")
    left.set_ylim(low, high)
    left.set_xlabel("gradient bytes sent per step per rank (log)")
    left.set_ylabel("final test accuracy (%)")
    left.set_title(f"{what}: accuracy vs bytes" if what else "accuracy vs bytes")
    left.grid(True, which="both", alpha=0.3)
    right.set_xlabel("epoch")
    longest = max([len(r["accuracy_per_epoch"]) for r in rows] + [1])
    if longest <= 12:
        right.set_xticks(range(1, longest + 1))  # whole epochs, also for a 1-epoch run
    else:
        right.xaxis.get_major_locator().set_params(integer=True)
    right.set_ylabel("test accuracy (%)")
    right.set_title("test accuracy per epoch")
    right.set_ylim(low, high)
    right.grid(True, alpha=0.3)
    right.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def write_markdown(args, rows, commands, path, stem, what):
    dense = next((r for r in rows if r["compressor"] == "none" and not r["momentum_correction"]), None)
    if args.logs:
        out = [f"# Compression vs accuracy: gradcomm-train logs, {what} ({args.date})", "",
               "One row per log given on the command line (named after its file); the settings are whatever "
               "those runs used. Bytes are what the logging rank sent for gradients; dense = the dense ring's "
               "bytes for the same allreduces.", ""]
    else:
        out = [f"# Compression vs accuracy: gradcomm-train, Fashion-MNIST, {args.ranks} ranks, CPU ({args.date})", "",
               f"MLP 784-512-256-10, {args.epochs} epochs, per-rank batch 32 (effective {32 * args.ranks}), SGD "
               f"momentum 0.9, lr {args.lr} with 0.5-epoch linear warm-up then cosine to 0, no weight decay, seed 1. "
               "Every rank trains on a disjoint shard; gradients are averaged per layer (keys fc1.weight, fc1.bias, "
               "...). Bytes are what rank 0 sent for gradients (Communicator::stats deltas, headers included); dense "
               "= 2(N-1)/N x tensor bytes per allreduce. One run per row (seed 1): differences of a few tenths of a "
               "point are within run-to-run noise.", ""]
    out += ["| run | compressor | final acc | best acc | Δ vs dense (pp) | bytes/step | savings | time (s) | "
            "compress (s) | comm (s) | status |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        delta = 100 * (r["final_test_accuracy"] - dense["final_test_accuracy"]) if dense else float("nan")
        spec = r["compressor"] + (" + momentum correction" if r["momentum_correction"] else "")
        out.append(f"| {r['name']} | `{spec}` | {r['final_test_accuracy']:.4f} | {r['best_test_accuracy']:.4f} | "
                   f"{delta:+.2f} | {r['wire_bytes_per_step'] / 1e3:.1f} kB | {r['savings_x']:.1f}x | "
                   f"{r['time_s']:.0f} | {r['compress_s']:.1f} | {r['comm_s']:.1f} | {r['status']} |")
    logs = f"Logs: {', '.join(f'`{l}`' for l in args.logs)}." if args.logs else f"Per-run logs: `{stem}/`."
    out += ["", f"Plots: `{stem}.png`. {logs} CSV: `{stem}.csv`.", "",
            "## Commands", "", "```bash", shlex.join([sys.executable] + sys.argv)]
    if commands:
        out += ["# which runs, one after the other (OPENBLAS_NUM_THREADS=1):"] + [shlex.join(c) for c in commands]
    out += ["```", ""]
    notes = path.replace(".md", "-notes.md")  # hand-written reading of the results, kept across reruns
    if os.path.exists(notes):
        out += [open(notes).read()]
    with open(path, "w") as f:
        f.write("\n".join(out))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("logs", nargs="*", metavar="LOG",
                   help="gradcomm-train --log files to tabulate and plot instead of running the sweep")
    p.add_argument("--build", default=None,
                   help="build directory with tools/gradcomm-run and trainer/gradcomm-train "
                        "(default: ./build when it has them, else PATH)")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--lr", type=float, default=0.03, help="peak learning rate, the same for every run")
    p.add_argument("--date", default=datetime.date.today().isoformat(), help="in the output names (default: today)")
    p.add_argument("--tag", default="", help="suffix of the output names (training-cpu-DATE-TAG)")
    p.add_argument("--out", default=".", help="output directory, created if missing (default: the current one)")
    p.add_argument("--only", default="", help="comma-separated run names (default: all)")
    p.add_argument("--reuse", action="store_true",
                   help="keep a finished run's log already under --out instead of running it again")
    p.add_argument("--force", action="store_true", help=argparse.SUPPRESS)  # the old default, kept for scripts
    args = p.parse_args()
    args.reuse = args.reuse and not args.force
    stem = f"training-cpu-{args.date}" + (f"-{args.tag}" if args.tag else "")
    rows, commands, logs = [], [], []
    if args.logs:
        for path in args.logs:
            lines = read_log(path)
            if not lines:
                sys.exit(f"experiments.py: {path}: no epoch records (is it a gradcomm-train --log file?)")
            name = os.path.splitext(os.path.basename(path))[0]
            spec, mc = lines[-1].get("compressor", "?"), bool(lines[-1].get("momentum_correction"))
            rows.append(summarize(name, spec, mc, lines, "ok"))
            logs.append(lines)
        os.makedirs(args.out, exist_ok=True)
    else:
        args.tools = find_tools(args.build)
        wanted = [n for n in args.only.split(",") if n]
        unknown = [n for n in wanted if n not in [r[0] for r in RUNS]]
        if unknown:
            sys.exit(f"experiments.py: unknown run(s) {unknown}; known: {[r[0] for r in RUNS]}")
        logdir = os.path.join(args.out, stem)
        os.makedirs(logdir, exist_ok=True)
        for name, spec, mc in RUNS:
            if wanted and name not in wanted:
                continue
            cmd, lines, status = run_one(args, name, spec, mc, logdir)
            commands.append(cmd)
            rows.append(summarize(name, spec, mc, lines, status))
            logs.append(lines)
    with open(os.path.join(args.out, stem + ".csv"), "w", newline="") as f:
        fields = [k for k in rows[0] if k != "accuracy_per_epoch"] + ["accuracy_per_epoch"]
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for r in rows:
            w.writerow(dict(r, accuracy_per_epoch=";".join(f"{a:.4f}" for a in r["accuracy_per_epoch"])))
    what = describe(logs)
    plot(rows, os.path.join(args.out, stem + ".png"), what)
    write_markdown(args, rows, commands, os.path.join(args.out, stem + ".md"), stem, what)
    print(f"wrote {os.path.join(args.out, stem)}.csv, .png, .md")


if __name__ == "__main__":
    main()
