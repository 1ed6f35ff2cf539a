"""gradcomm-plot: PNGs of your own runs.

    gradcomm-plot FILES... --out DIR          (or: python -m gradcomm.plot ...)

Each FILE is one of
  * a trainer log: `gradcomm-train --log FILE` writes one JSON object per line, one
    per epoch (test_accuracy, wire_bytes, time_s and its parts, world_size,
    compressor, ...); a line without "epoch" is the run's settings and only feeds
    the titles and labels;
  * a gradcomm-bench result: `gradcomm-bench --json FILE` writes one JSON list, one
    record per (size, implementation): size_bytes, time_us, busbw_gbps, impl,
    compressor, ranks, ... (bench/cluster/run.sh's lists add link_rate).
The kind is told from the content, not the name. Written into DIR:
  accuracy.png   trainer logs: test accuracy against epoch and against the bytes the
                 logging rank sent, one line per run (all logs overlaid)
  phases.png     trainer logs: wall time per epoch split into its parts, one
                 stacked bar per run
  bench.png      bench results: time and bus bandwidth against size, one line per
                 implementation / compressor (all results overlaid)
Titles and labels come from the records (ranks, compressor, model, dataset, link),
so a plot says what was run. A missing or malformed file is a one-line error naming
it (and the line, for a trainer log) and exit status 2.

Only this module needs matplotlib, and it imports it when it draws: `import
gradcomm` never does.
"""
import argparse
import collections
import json
import math
import os
import re
import sys

# Parts of an epoch's wall time, as gradcomm-train logs them (trainer/train.cc).
# Older logs have no data_s / other_s: what the parts leave of time_s is "other".
_WALL_PARTS = [("compute_s", "compute"), ("comm_s", "comm (exposed)"), ("data_s", "data"),
               ("eval_s", "eval"), ("other_s", "other")]
_EPOCH_KEYS = ("epoch", "test_accuracy", "wire_bytes", "time_s")
_BENCH_KEYS = ("size_bytes", "time_us", "busbw_gbps", "impl")


class InputError(Exception):
    """A file this tool cannot read: the message names the file (and line)."""

    def __init__(self, path, message, line=None):
        where = f"{path}:{line}" if line is not None else path
        super().__init__(f"{where}: {message}")


# ---------------------------------------------------------------- reading ----

TrainRun = collections.namedtuple("TrainRun", "path epochs settings")
BenchResult = collections.namedtuple("BenchResult", "path records")


def _number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_epoch(path, line, rec):
    for key in _EPOCH_KEYS:
        if key not in rec:
            raise InputError(path, f"epoch record without \"{key}\"", line)
    for key in ("test_accuracy", "wire_bytes", "time_s"):
        if not _number(rec[key]):
            raise InputError(path, f"\"{key}\" is {json.dumps(rec[key])}, not a number", line)


def _read_train_log(path, text):
    epochs, settings = [], {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise InputError(path, f"not JSON ({e.msg}, column {e.colno})", number) from None
        if not isinstance(rec, dict):
            raise InputError(path, "expected a JSON object per line (a gradcomm-train --log file)", number)
        if "epoch" in rec:
            _check_epoch(path, number, rec)
            epochs.append(rec)
        else:
            # The run's settings: flat, or nested under "config".
            settings.update(rec.get("config") if isinstance(rec.get("config"), dict) else rec)
    if not epochs:
        raise InputError(path, "no epoch records (lines with \"epoch\"): is this a gradcomm-train --log file?")
    return TrainRun(path, epochs, settings)


def _read_bench(path, text):
    try:
        records = json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(path, f"not JSON ({e.msg}, column {e.colno})", e.lineno) from None
    if not isinstance(records, list) or not records:
        raise InputError(path, "expected a non-empty JSON list of gradcomm-bench records")
    for i, rec in enumerate(records):
        missing = [k for k in _BENCH_KEYS if not isinstance(rec, dict) or k not in rec]
        if missing:
            raise InputError(path, f"record {i} has no {', '.join(missing)}: not a gradcomm-bench --json record")
        for k in ("size_bytes", "time_us", "busbw_gbps"):
            if not _number(rec[k]):
                raise InputError(path, f"record {i}: \"{k}\" is {json.dumps(rec[k])}, not a number")
    return BenchResult(path, records)


def read_file(path):
    """A TrainRun or a BenchResult, told apart by the content; InputError otherwise."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(path, f"cannot read: {getattr(e, 'strerror', None) or e}") from None
    if not text.strip():
        raise InputError(path, "empty file")
    # A bench result is one JSON list; a trainer log is lines of JSON objects.
    if text.lstrip().startswith("["):
        return _read_bench(path, text)
    return _read_train_log(path, text)


# ------------------------------------------------------- titles and labels ----

def _plural(n, word):
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _run_fields(run):
    """What a trainer run says about itself: {field: text}, fields absent when unknown."""
    last = run.epochs[-1]
    # Settings lines first; then what the epoch records say about the run.
    s = dict(run.settings)
    s.update({k: last[k] for k in ("model", "dataset", "device", "link") if last.get(k)})
    f = {}
    dataset = s.get("dataset") or (os.path.basename(str(s["data_dir"]).rstrip("/")) if s.get("data_dir") else None)
    if dataset:
        f["dataset"] = str(dataset)
    if s.get("model"):
        f["model"] = str(s["model"])
    elif isinstance(s.get("hidden"), list):
        f["model"] = "MLP hidden " + "-".join(str(h) for h in s["hidden"])
    ranks = last.get("world_size", s.get("world_size", s.get("ranks")))
    if ranks is not None:
        f["ranks"] = _plural(ranks, "rank")
    compressor = last.get("compressor", s.get("compressor"))
    if compressor is not None:
        mc = last.get("momentum_correction", s.get("momentum_correction"))
        f["compressor"] = str(compressor) + (" + momentum correction" if mc else "")
    for key in ("link", "link_rate"):
        if s.get(key):
            f["link"] = f"link {s[key]}"
    if s.get("device"):
        f["device"] = str(s["device"])
    return f


_TITLE_ORDER = ("dataset", "model", "ranks", "compressor", "link", "device")


def _split_fields(field_sets, order):
    """(the fields every item shares, for the title; per item, the fields that differ)."""
    keys = [k for k in order if any(k in f for f in field_sets)]
    common = {k: field_sets[0][k] for k in keys
              if all(k in f for f in field_sets) and all(f[k] == field_sets[0][k] for f in field_sets)}
    differing = [{k: f[k] for k in keys if k in f and k not in common} for f in field_sets]
    return common, differing


def _unique_labels(labels, paths):
    """Labels that repeat get their file's name appended, so every line is told apart."""
    counts = collections.Counter(labels)
    return [l if l and counts[l] == 1 else f"{l} ({os.path.basename(p)})" if l else os.path.basename(p)
            for l, p in zip(labels, paths)]


def train_labels(runs):
    """(title text, one label per run): shared fields in the title, the rest in the labels."""
    common, differing = _split_fields([_run_fields(r) for r in runs], _TITLE_ORDER)
    title = ", ".join(common[k] for k in _TITLE_ORDER if k in common)
    labels = [", ".join(d[k] for k in _TITLE_ORDER if k in d) for d in differing]
    return title, _unique_labels(labels, [r.path for r in runs])


def _bench_series_fields(rec):
    impl = rec["impl"]
    if impl == "gradcomm":
        compressor = rec.get("compressor", "none")
        impl = "gradcomm ring (dense)" if compressor in ("none", None) else f"gradcomm {compressor}"
    f = {"impl": impl}
    for key in ("op", "dtype", "device"):
        if rec.get(key) is not None:
            f[key] = str(rec[key])
    if rec.get("ranks") is not None:
        f["ranks"] = _plural(rec["ranks"], "rank")
    if rec.get("link_rate"):
        delay = rec.get("delay")
        if delay not in (None, "", "0"):
            f["link"] = f"link {rec['link_rate']} + {delay} delay" + (
                " (not applied)" if rec.get("delay_applied") is False else "")
        else:
            f["link"] = f"link {rec['link_rate']}"
    return f


_BENCH_ORDER = ("op", "dtype", "device", "ranks", "link", "impl")


def bench_series(results):
    """(title text, [(label, [(size, mean time_us, mean busbw_gbps)], is a peer)]): one series per file
    and implementation/compressor/setting, repeated sizes averaged."""
    groups = collections.OrderedDict()
    for res in results:
        for rec in res.records:
            f = _bench_series_fields(rec)
            key = (res.path,) + tuple(sorted(f.items()))
            groups.setdefault(key, (res.path, f, collections.defaultdict(list)))[2][rec["size_bytes"]].append(rec)
    entries = list(groups.values())
    common, differing = _split_fields([f for _, f, _ in entries], _BENCH_ORDER)
    title = ", ".join(common[k] for k in _BENCH_ORDER if k in common and k != "impl")
    # The implementation is always in the label, even when every line shares it.
    labels = _unique_labels([", ".join([d[k] for k in _BENCH_ORDER if k in d and k != "impl"] + [f["impl"]])
                             for d, (_, f, _) in zip(differing, entries)], [p for p, _, _ in entries])
    series = []
    for label, (_, f, by_size) in zip(labels, entries):
        pts = [(size, sum(r["time_us"] for r in rs) / len(rs), sum(r["busbw_gbps"] for r in rs) / len(rs))
               for size, rs in sorted(by_size.items())]
        series.append((label, pts, not f["impl"].startswith("gradcomm")))
    return title, series


# ---------------------------------------------------------------- drawing ----

def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise InputError("matplotlib", "not installed; gradcomm-plot needs it (pip install matplotlib)") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _colors(plt, n):
    palette = plt.get_cmap("tab10" if n <= 10 else "tab20").colors
    return [palette[i % len(palette)] for i in range(n)]


def _wrap(text, width):
    """Lines of at most about `width` characters, broken after spaces and commas (a
    compressor spec has no spaces: "topk:ratio=0.01,min_numel=1024")."""
    lines, line = [], ""
    for piece in re.findall(r"[^ ,]*[ ,]*", text):
        if line and len(line) + len(piece) > width:
            lines.append(line.rstrip())
            line = ""
        line += piece
    return "\n".join(lines + [line.rstrip()])


def _with_title(what, title):
    return f"{what}: {title}" if title else what


def accuracy_figure(runs):
    """Test accuracy against epoch (left) and against cumulative bytes sent (right)."""
    plt = _pyplot()
    from matplotlib.ticker import FuncFormatter
    title, labels = train_labels(runs)
    fig, (by_epoch, by_bytes) = plt.subplots(1, 2, figsize=(12, 5))
    for run, label, color in zip(runs, labels, _colors(plt, len(runs))):
        epochs = [r["epoch"] for r in run.epochs]
        acc = [100 * r["test_accuracy"] for r in run.epochs]
        sent, total = [], 0
        for r in run.epochs:
            total += r["wire_bytes"]
            sent.append(total / 1e6)
        by_epoch.plot(epochs, acc, marker="o", color=color, label=label)
        by_bytes.plot(sent, acc, marker="o", color=color, label=label)
    by_epoch.set_xlabel("epoch")
    by_epoch.set_ylabel("test accuracy (%)")
    by_epoch.set_title("per epoch")
    # Whole epochs only: a 1-epoch run gets one tick, not 0.96 ... 1.04.
    all_epochs = sorted({r["epoch"] for run in runs for r in run.epochs})
    if len(all_epochs) <= 12:
        by_epoch.set_xticks(all_epochs)
    else:
        by_epoch.xaxis.get_major_locator().set_params(integer=True)
    sent_all = [sum(r["wire_bytes"] for r in run.epochs[:i + 1]) for run in runs for i in range(len(run.epochs))]
    positive = [s for s in sent_all if s > 0]
    if positive and max(positive) / min(positive) > 20:
        by_bytes.set_xscale("log")
        by_bytes.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
    by_bytes.set_xlabel("gradient bytes sent by the logging rank, cumulative (MB)")
    by_bytes.set_title("against bytes sent")
    for ax in (by_epoch, by_bytes):
        ax.grid(True, which="both", alpha=0.3)
    fig.suptitle(_with_title("Test accuracy", title))
    if any(labels):
        # Below both panels: compressor specs are long, and inside a panel they hide points.
        fig.legend(*by_epoch.get_legend_handles_labels(), loc="lower center", ncol=min(2, len(runs)), fontsize=8)
        fig.tight_layout(rect=(0, 0.06 + 0.035 * math.ceil(len(runs) / 2), 1, 1))
    else:
        fig.tight_layout()
    return fig


def _wall_parts(rec):
    """{part label: seconds} of one epoch that add up to its wall time, and the
    compress time when it ran overlapped (beside the wall time, not in it)."""
    parts = {label: rec[key] for key, label in _WALL_PARTS if _number(rec.get(key))}
    overlapped = rec.get("overlap", False)
    if _number(rec.get("compress_s")):
        if overlapped:
            compress_beside = rec["compress_s"]
        else:
            parts["compress"] = rec["compress_s"]
            compress_beside = None
    else:
        compress_beside = None
    if "other" not in parts:
        parts["other"] = max(0.0, rec["time_s"] - sum(parts.values()))
    return parts, compress_beside


def phases_figure(runs):
    """One stacked bar per run: the mean epoch's wall time split into its parts."""
    plt = _pyplot()
    title, labels = train_labels(runs)
    means, beside = [], []
    for run in runs:
        sums, extra = collections.defaultdict(float), 0.0
        for rec in run.epochs:
            parts, compress = _wall_parts(rec)
            for k, v in parts.items():
                sums[k] += v
            extra += compress or 0.0
        n = len(run.epochs)
        means.append({k: v / n for k, v in sums.items()})
        beside.append(extra / n)
    order = [label for _, label in _WALL_PARTS[:-1]] + ["compress", "other"]
    present = [p for p in order if any(m.get(p, 0) > 0 for m in means)]
    fig, ax = plt.subplots(figsize=(max(8, 1.6 * len(runs) + 5), 5))
    colors = dict(zip(order, _colors(plt, len(order))))
    xs = list(range(len(runs)))
    bottom = [0.0] * len(runs)
    for part in present:
        heights = [m.get(part, 0.0) for m in means]
        ax.bar(xs, heights, 0.5, bottom=bottom, color=colors[part], label=part)
        bottom = [b + h for b, h in zip(bottom, heights)]
    if any(beside):
        ax.bar([x + 0.34 for x in xs], [b if b > 0 else float("nan") for b in beside], 0.14, color="none", edgecolor="grey", hatch="///",
               label="compress (overlapped: beside the wall time, not in it)")
    for x, total in zip(xs, bottom):
        ax.annotate(f"{total:.1f} s", (x, total), textcoords="offset points", xytext=(0, 3), ha="center", fontsize=8)
    ax.set_xticks(xs)
    ax.set_xticklabels([_wrap(l or os.path.basename(r.path), 26) for l, r in zip(labels, runs)], fontsize=8)
    ax.set_xlim(-0.6, len(runs) - 0.4)
    ax.set_ylabel("seconds per epoch (mean over the run's epochs)")
    ax.set_ylim(0, max(bottom + beside) * 1.12 or 1)
    ax.grid(axis="y", alpha=0.3)
    # Outside the axes, right: inside it would cover the tallest bar and its total.
    handles, names = ax.get_legend_handles_labels()
    ax.legend(handles[::-1], [_wrap(n, 28) for n in names[::-1]], fontsize=8, loc="upper left",
              bbox_to_anchor=(1.01, 1.0))
    ax.set_title(_with_title("Time per epoch", title), fontsize=10)
    fig.tight_layout()
    return fig


def _size_text(b, _pos=None):
    for unit, f in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if b >= f:
            v = b / f
            return f"{v:.0f}{unit}" if v == int(v) else f"{v:.1f}{unit}"
    return f"{b:.0f}"


def bench_figure(results):
    """Time (left) and bus bandwidth (right) against message size, one line per series."""
    plt = _pyplot()
    from matplotlib.ticker import FuncFormatter, FixedLocator, NullLocator
    title, series = bench_series(results)
    # Many lines (a cluster sweep): the legend goes below the panels, not over them.
    below = len(series) > 6
    legend_rows = math.ceil(len(series) / 2) if below else 0
    fig, (time_ax, bw_ax) = plt.subplots(1, 2, figsize=(12, 5 + 0.2 * legend_rows))
    for i, ((label, pts, peer), color) in enumerate(zip(series, _colors(plt, len(series)))):
        dashed = "--" if peer else "-"
        marker = "osD^v"[(i // 10) % 5]  # past ten lines colours repeat: the marker tells them apart
        sizes = [p[0] for p in pts]
        time_ax.plot(sizes, [p[1] for p in pts], dashed, marker=marker, ms=3, color=color, label=label)
        bw_ax.plot(sizes, [p[2] for p in pts], dashed, marker=marker, ms=3, color=color, label=label)
    # Ticks at measured sizes, at most about 10 of them.
    sizes = sorted({p[0] for _, pts, _ in series for p in pts})
    ticks = sizes[::max(1, math.ceil(len(sizes) / 10))]
    for ax in (time_ax, bw_ax):
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_locator(FixedLocator(ticks))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.xaxis.set_major_formatter(FuncFormatter(_size_text))
        ax.set_xlabel("message size (bytes)")
        ax.grid(True, which="both", alpha=0.3)
    time_ax.set_yscale("log")
    time_ax.set_ylabel("time per call (us), slowest rank")
    time_ax.set_title("time")
    # busbw as nccl-tests defines it, from the uncompressed size: compressors show as faster.
    bw_ax.set_ylabel("bus bandwidth (GB/s, of the uncompressed size)")
    bw_ax.set_title("bus bandwidth")
    fig.suptitle(_with_title("gradcomm-bench", title))
    if below:
        fig.legend(*time_ax.get_legend_handles_labels(), loc="lower center", ncol=2, fontsize=8)
        fig.tight_layout(rect=(0, (0.2 * legend_rows + 0.2) / (5 + 0.2 * legend_rows), 1, 1))
    else:
        time_ax.legend(fontsize=8)
        fig.tight_layout()
    return fig


# -------------------------------------------------------------------- CLI ----

def plot_files(paths, out_dir):
    """Reads every file (all of them before drawing anything), writes the PNGs, and
    returns [(png path, what it shows)]. InputError for a file it cannot use."""
    items = [read_file(p) for p in paths]
    runs = [i for i in items if isinstance(i, TrainRun)]
    results = [i for i in items if isinstance(i, BenchResult)]
    os.makedirs(out_dir, exist_ok=True)
    written = []
    plt = _pyplot()

    def save(fig, name, what):
        path = os.path.join(out_dir, name)
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append((path, what))

    if runs:
        what = f"{_plural(len(runs), 'trainer log')}: " + ", ".join(os.path.basename(r.path) for r in runs)
        save(accuracy_figure(runs), "accuracy.png", "test accuracy vs epoch and bytes sent, " + what)
        save(phases_figure(runs), "phases.png", "time per epoch by phase, " + what)
    if results:
        what = f"{_plural(len(results), 'bench result')}: " + ", ".join(os.path.basename(r.path) for r in results)
        save(bench_figure(results), "bench.png", "time and bus bandwidth vs size, " + what)
    return written


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="gradcomm-plot", description=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="+", metavar="FILE",
                        help="gradcomm-train --log files and gradcomm-bench --json files, in any mix")
    parser.add_argument("--out", required=True, metavar="DIR", help="where to write the PNGs (created if missing)")
    args = parser.parse_args(argv)
    try:
        written = plot_files(args.files, args.out)
    except InputError as e:
        print(f"gradcomm-plot: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"gradcomm-plot: {e.filename or args.out}: {e.strerror or e}", file=sys.stderr)
        return 2
    for path, what in written:
        print(f"wrote {path} ({what})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
