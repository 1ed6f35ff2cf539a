#!/usr/bin/python3
"""One e2e record from a gradcomm-train run: its per-rank JSON logs (--log FILE.rank{rank}.jsonl),
the last epoch of each (epoch 1 is the warm-up).

    train_record.py VARIANT RANKS OVERLAP_FLAG_SUPPORTED LOG...   -> one JSON record on stdout

Step time per rank: `step_s_median` / `step_s_p90` where the trainer logs them, else
(time_s - eval_s) / steps (the epoch's wall time without the test evaluation; then
`step_time_source` says "epoch_mean"). The record's step_s_median is the max over ranks of
the per-rank values (a synchronous step ends when the slowest rank's does); compute_s,
compress_s and comm_s (exposed communication: waiting) are per step, averaged over ranks.
"""
import json
import sys


def last_epoch(path):
    with open(path) as f:
        lines = [json.loads(line) for line in f if line.strip()]
    if not lines:
        raise SystemExit(f"train_record: {path} has no epoch line")
    return lines[-1]


def main(argv):
    variant, ranks, flag, paths = argv[0], int(argv[1]), argv[2] == "true", argv[3:]
    epochs = [last_epoch(p) for p in paths]
    if len(epochs) != ranks:
        raise SystemExit(f"train_record: {len(epochs)} rank logs, expected {ranks}")
    per_rank, p90, source = [], [], "trainer"
    for e in epochs:
        if e.get("step_s_median") is not None:
            per_rank.append(e["step_s_median"])
            p90.append(e.get("step_s_p90", e["step_s_median"]))
        else:
            source = "epoch_mean"
            mean = (e["time_s"] - e.get("eval_s", 0.0)) / e["steps"]
            per_rank.append(mean)
            p90.append(mean)
    steps = epochs[0]["steps"]
    per_step = lambda key: (sum(e[key] for e in epochs) / len(epochs) / steps) if key in epochs[0] else None
    record = {
        "variant": variant, "kind": "train", "ranks": ranks, "batch_size": 64, "steps": steps,
        "compressor": epochs[0].get("compressor"),
        "step_s_median": max(per_rank), "step_s_p90": max(p90), "step_s_rank_median": per_rank,
        "step_time_source": source,
        "compute_s_per_step": per_step("compute_s"), "compress_s_per_step": per_step("compress_s"),
        "comm_s_per_step": per_step("comm_s"),
        "wire_bytes_per_step": per_step("wire_bytes"),  # gradcomm's count, per rank
        "overlap": epochs[0].get("overlap"), "overlap_flag_supported": flag,
        "final_loss": epochs[0].get("train_loss"), "test_accuracy": epochs[0].get("test_accuracy"),
    }
    print(json.dumps(record))


if __name__ == "__main__":
    main(sys.argv[1:])
