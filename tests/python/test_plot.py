"""gradcomm-plot (python -m gradcomm.plot): trainer logs and bench results in, PNGs
out, titles and labels taken from the records, one-line errors (exit 2) for files it
cannot use. The inputs are synthetic but shaped like real ones: the records below
copy the fields of bench/results/plot-examples-2026-11-24/{train-topk.jsonl,bench.json}."""
import json
import os
import struct
import subprocess
import sys

import pytest

pytest.importorskip("matplotlib")
from gradcomm import plot  # noqa: E402  (after the skip: needs matplotlib to draw)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def epoch_record(epoch, accuracy, wire, world_size=2, compressor="none", mc=False, overlap=True):
    """One line of `gradcomm-train --log` (trainer/train.cc, end_epoch)."""
    return {"comm_s": 4.5, "compress_s": 0.9, "compressor": compressor, "compute_s": 4.25, "data_s": 0.05,
            "dense_bytes": 2008245864, "epoch": epoch, "eval_s": 0.15, "lr": 0.05, "momentum_correction": mc,
            "other_s": 0.05, "overlap": overlap, "rank": 0, "skipped_steps": 0, "step_s_median": 0.0085,
            "step_s_p90": 0.0117, "steps": 937, "test_accuracy": accuracy, "test_loss": 0.38, "time_s": 9.0,
            "train_loss": 0.62, "wire_bytes": wire, "world_size": world_size}


def bench_record(impl, size, time_us, compressor="none", ranks=2, **extra):
    """One element of `gradcomm-bench --json`'s list (bench/bench_table.cc, add_record)."""
    algbw = size / time_us / 1e3
    rec = {"op": "allreduce", "impl": impl, "compressor": compressor, "dtype": "float32", "device": "cpu",
           "ranks": ranks, "size_bytes": size, "count": size // 4, "time_us": time_us, "algbw_gbps": algbw,
           "busbw_gbps": algbw * 2 * (ranks - 1) / ranks, "wire_bytes": float(size), "wrong": None, "warmup": 5,
           "iters": 20, "input": "gradient"}
    rec.update(extra)
    return rec


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def write_bench(path, records):
    path.write_text(json.dumps(records, indent=2) + "\n")
    return str(path)


@pytest.fixture
def inputs(tmp_path):
    topk = "topk:ratio=0.01,min_numel=1024"
    logs = [
        write_jsonl(tmp_path / "dense.jsonl", [epoch_record(e, 0.80 + 0.02 * e, 2_000_000_000) for e in (1, 2, 3)]),
        write_jsonl(tmp_path / "topk.jsonl",
                    [epoch_record(e, 0.79 + 0.02 * e, 19_000_000, compressor=topk, mc=True) for e in (1, 2, 3)]),
    ]
    sizes = [8 << (2 * i) for i in range(9)]  # 8 B .. 512 KiB
    bench = [write_bench(tmp_path / "bench.json",
                         [bench_record("gradcomm", z, 400 + z / 1e3) for z in sizes] +
                         [bench_record("gloo", z, 900 + z / 5e2) for z in sizes])]
    return logs, bench


def run_cli(*args):
    env = dict(os.environ, MPLBACKEND="Agg")
    return subprocess.run([sys.executable, "-m", "gradcomm.plot", *args], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, timeout=120, env=env)


def png_size(path):
    """(width, height) from the IHDR chunk, after checking the signature."""
    with open(path, "rb") as f:
        head = f.read(24)
    assert head[:8] == PNG_SIGNATURE, f"{path} is not a PNG"
    assert head[12:16] == b"IHDR"
    return struct.unpack(">II", head[16:24])


# ---- the CLI -------------------------------------------------------------------------

def test_cli_writes_valid_pngs_for_trainer_logs_and_bench_results(tmp_path, inputs):
    logs, bench = inputs
    out = tmp_path / "out"
    r = run_cli(*logs, *bench, "--out", str(out))
    assert r.returncode == 0, r.stderr
    for name in ("accuracy.png", "phases.png", "bench.png"):
        path = out / name
        assert f"wrote {path}" in r.stdout, r.stdout
        width, height = png_size(path)
        assert width >= 500 and height >= 300
        assert path.stat().st_size > 10_000  # drawn, not an empty canvas


def test_cli_tells_the_kind_from_the_content_not_the_name(tmp_path):
    # A trainer log named .json and a bench result named .jsonl.
    log = write_jsonl(tmp_path / "run.json", [epoch_record(1, 0.85, 10)])
    bench = write_bench(tmp_path / "bench.jsonl", [bench_record("gradcomm", 1024, 500.0)])
    r = run_cli(log, "--out", str(tmp_path / "a"))
    assert r.returncode == 0, r.stderr
    assert sorted(os.listdir(tmp_path / "a")) == ["accuracy.png", "phases.png"]
    r = run_cli(bench, "--out", str(tmp_path / "b"))
    assert r.returncode == 0, r.stderr
    assert os.listdir(tmp_path / "b") == ["bench.png"]


def test_cli_help_exits_zero_and_describes_the_inputs():
    r = run_cli("--help")
    assert r.returncode == 0
    assert "--out" in r.stdout and "gradcomm-train --log" in r.stdout and "gradcomm-bench --json" in r.stdout


def test_missing_file_is_a_one_line_error_naming_it(tmp_path, inputs):
    missing = str(tmp_path / "nope.jsonl")
    r = run_cli(inputs[0][0], missing, "--out", str(tmp_path / "out"))
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and missing in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "out").exists()  # nothing drawn from a partial set of inputs


def test_malformed_jsonl_line_names_the_file_and_the_line(tmp_path):
    path = tmp_path / "broken.jsonl"
    path.write_text(json.dumps(epoch_record(1, 0.8, 10)) + "\n" + json.dumps(epoch_record(2, 0.81, 10)) + "\n"
                    + '{"epoch": 3, "test_accuracy": \n')
    r = run_cli(str(path), "--out", str(tmp_path / "out"))
    assert r.returncode == 2
    assert f"{path}:3:" in r.stderr and r.stderr.strip().count("\n") == 0 and "Traceback" not in r.stderr


def test_epoch_record_without_a_field_names_the_line_and_the_field(tmp_path):
    bad = epoch_record(2, 0.81, 10)
    del bad["wire_bytes"]
    path = write_jsonl(tmp_path / "short.jsonl", [epoch_record(1, 0.8, 10), bad])
    r = run_cli(path, "--out", str(tmp_path / "out"))
    assert r.returncode == 2 and f"{path}:2:" in r.stderr and "wire_bytes" in r.stderr


def test_bench_json_that_is_not_bench_records_names_the_file(tmp_path):
    path = write_bench(tmp_path / "other.json", [{"size": 8}])
    r = run_cli(path, "--out", str(tmp_path / "out"))
    assert r.returncode == 2 and path in r.stderr and "size_bytes" in r.stderr


# ---- titles and labels come from the records -----------------------------------------

def texts(fig):
    """The suptitle, the axes' titles and every legend entry of a figure."""
    out = [fig._suptitle.get_text()] if fig._suptitle else []
    legends = list(fig.legends)
    for ax in fig.axes:
        out.append(ax.get_title())
        if ax.get_legend():
            legends.append(ax.get_legend())
    out += [t.get_text() for lg in legends for t in lg.get_texts()]
    return out


def test_training_title_has_the_shared_ranks_and_labels_the_compressors(inputs):
    runs = [plot.read_file(p) for p in inputs[0]]
    fig = plot.accuracy_figure(runs)
    title = fig._suptitle.get_text()
    assert "2 ranks" in title and "4 ranks" not in title
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend == ["none", "topk:ratio=0.01,min_numel=1024 + momentum correction"]


def test_training_runs_of_different_sizes_are_told_apart_in_the_labels(tmp_path):
    a = write_jsonl(tmp_path / "a.jsonl", [epoch_record(1, 0.8, 10, world_size=2, compressor="fp16")])
    b = write_jsonl(tmp_path / "b.jsonl", [epoch_record(1, 0.8, 10, world_size=4, compressor="fp16")])
    c = write_jsonl(tmp_path / "c.jsonl", [{"hidden": [64, 32], "data_dir": "/data/fashion-mnist/"},
                                           epoch_record(1, 0.8, 10, world_size=1, compressor="fp16")])
    title, labels = plot.train_labels([plot.read_file(p) for p in (a, b, c)])
    assert title == "fp16"  # the one thing all three share
    assert labels[:2] == ["2 ranks", "4 ranks"]
    # The settings line of c feeds its label: dataset and model, then its size.
    assert labels[2] == "fashion-mnist, MLP hidden 64-32, 1 rank"


def test_identical_runs_get_their_file_names(tmp_path):
    paths = [write_jsonl(tmp_path / f"seed{i}.jsonl", [epoch_record(1, 0.8, 10)]) for i in (1, 2)]
    _, labels = plot.train_labels([plot.read_file(p) for p in paths])
    assert labels == ["seed1.jsonl", "seed2.jsonl"]


def test_phase_bars_stack_the_logged_parts(tmp_path):
    path = write_jsonl(tmp_path / "blocking.jsonl",
                       [epoch_record(1, 0.8, 10, overlap=False), epoch_record(2, 0.8, 10, overlap=False)])
    fig = plot.phases_figure([plot.read_file(path)])
    ax = fig.axes[0]
    heights = {label: patch.get_height() for container, label in zip(ax.containers, ax.get_legend_handles_labels()[1])
               for patch in container}
    # Blocking steps: compress is inside the wall time, so it is one of the stacked parts.
    assert heights["compute"] == pytest.approx(4.25)
    assert heights["comm (exposed)"] == pytest.approx(4.5)
    assert heights["compress"] == pytest.approx(0.9)
    assert heights["other"] == pytest.approx(0.05)
    assert "2 ranks" in ax.get_title() and "none" in ax.get_title()


def test_bench_title_and_labels_come_from_the_records(tmp_path):
    recs = [bench_record("gradcomm", z, 100.0 + z, ranks=2, link_rate="10gbit", delay="50us") for z in (8, 64)]
    recs += [bench_record("gradcomm", z, 50.0 + z, compressor="topk:ratio=0.01", ranks=2, link_rate="10gbit",
                          delay="50us") for z in (8, 64)]
    recs += [bench_record("mpi", z, 300.0 + z, ranks=2, link_rate="10gbit", delay="50us") for z in (8, 64)]
    # A repeated size in one file (run.sh measures the dense ring twice) is averaged.
    recs.append(bench_record("mpi", 64, 500.0 + 64, ranks=2, link_rate="10gbit", delay="50us"))
    title, series = plot.bench_series([plot.read_file(write_bench(tmp_path / "n2.json", recs))])
    assert title == "allreduce, float32, cpu, 2 ranks, link 10gbit + 50us delay"
    assert [s[0] for s in series] == ["gradcomm ring (dense)", "gradcomm topk:ratio=0.01", "mpi"]
    assert [s[2] for s in series] == [False, False, True]  # only the peer is drawn dashed
    mpi = dict((p[0], p[1]) for p in series[2][1])
    assert mpi[64] == pytest.approx((364.0 + 564.0) / 2)
    fig = plot.bench_figure([plot.read_file(str(tmp_path / "n2.json"))])
    assert "2 ranks" in fig._suptitle.get_text() and "link 10gbit" in fig._suptitle.get_text()
    assert "gradcomm topk:ratio=0.01" in texts(fig)


def test_bench_results_of_two_world_sizes_keep_ranks_in_the_labels(tmp_path):
    a = write_bench(tmp_path / "n2.json", [bench_record("gradcomm", 8, 100.0, ranks=2)])
    b = write_bench(tmp_path / "n4.json", [bench_record("gradcomm", 8, 200.0, ranks=4)])
    title, series = plot.bench_series([plot.read_file(a), plot.read_file(b)])
    assert "ranks" not in title
    assert [s[0] for s in series] == ["2 ranks, gradcomm ring (dense)", "4 ranks, gradcomm ring (dense)"]
