"""Table of bench/fsdp/run.sh's records: per variant the median epoch-2 step time over
the rounds, the reduce-scatter bytes each rank sent per step against a dense ring's,
and the test accuracy (after 2 short epochs: a sanity column, not the accuracy
comparison, which tests/python/test_torch2_fsdp.py makes on full epochs)."""
import json
import statistics
import sys

records = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
variants = list(dict.fromkeys(r["variant"] for r in records))
first = records[0] if records else {}
print(f"# Compressed FSDP vs dense FSDP over gloo: {first.get('world', 2)} ranks, emulated link "
      f"{first.get('rate', '?')}, MLP 784-{first.get('hidden', '?').replace(',', '-')}-10 (fully_shard per Linear)\n")
print("| variant | step time (median, ms) | runs | reduce-scatter bytes/rank/step | dense allreduce ring "
      "| true dense reduce-scatter | saved vs true reduce-scatter | all-gather bytes/rank/step (exact) | test accuracy |")
print("|---|---|---|---|---|---|---|---|---|")
base = None
for v in variants:
    rs = [r for r in records if r["variant"] == v]
    step_ms = statistics.median(r["step_s"] for r in rs) * 1e3
    if v == "gloo":
        base = step_ms
    # The counters cover both epochs (and the evaluations' all-gathers): per step of training.
    steps = sum(r["steps"] for r in rs[:1]) * 2
    if "bytes_sent" in rs[0]:
        sent = rs[0]["reduce_bytes_sent"] / steps
        gathered = rs[0]["gathered_bytes"] / steps
        if "dense_reduce_scatter_bytes" in rs[0]:  # counted per reduce-scatter: (N-1)/N x bytes
            true_rs = rs[0]["dense_reduce_scatter_bytes"] / steps
            dense = 2 * true_rs
        else:  # records before the library's reduce-scatter counted a dense allreduce ring
            dense = rs[0]["dense_ring_bytes"] / steps
            true_rs = dense / 2  # (N-1)/N x bytes, where the dense ring sends 2(N-1)/N x bytes
        cols = (f"{sent / 1e6:.2f} MB | {dense / 1e6:.2f} MB | {true_rs / 1e6:.2f} MB | "
                f"{true_rs / sent:.1f}x | {gathered / 1e6:.2f} MB*")
    else:
        cols = "(dense) | | | | "
    rel = f" ({step_ms / base:.2f}x gloo)" if base and v != "gloo" else ""
    print(f"| {v} | {step_ms:.1f}{rel} | {len(rs)} | {cols} | {statistics.median(r['test_accuracy'] for r in rs):.4f} |")
print("\nThe backend's reduce-scatters, compared here with a true dense reduce-scatter (gloo's), the fair "
      "baseline: exact ones and those compressed with the compressed ring's codecs (fp16, bf16, quant, qsgd, "
      "sign) are the library's reduce-scatter ((N-1)/N of the input, compressed); the others (top-k and the "
      "rest) are a compressed allreduce of the whole input. Records made before 2026-11-27's evening ran every "
      "reduce-scatter as an allreduce.")
print("\n*The all-gathers include those of the two evaluations (10,000 test images each), so per training "
      "step they read high; they are exact and the same for every variant.")
