#!/usr/bin/python3
"""torch.topk versus gradcomm's GPU top-k on the same data, in one run.

For each size (default 1M, 16M, 128M float32): writes the same random gradient to a
raw float32 file, times torch.topk(x.abs(), k) on the GPU with CUDA events (warm-up,
median of --iters), runs `bench_cuda_sparse --input FILE --json ...` on that file,
and prints torch's time over ours for top-k exact and sample at ratio 0.01 / 0.001.
(torch.topk returns values and indices sorted by value; ours returns indices in
increasing order with their values, which is what the sparse payload needs.)

Without a CUDA device (or without torch) it prints "no CUDA device" and exits 0.

  /usr/bin/python3 bench/cuda/torch_topk.py --bench build/bench/bench_cuda_sparse
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile


def parse_size(text):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    return int(text[:-1] if mult > 1 else text) * mult


def time_torch_topk(torch, x, k, warmup, iters):
    for _ in range(warmup):
        torch.topk(x.abs(), k)
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start = torch.cuda.Event(enable_timing=True)
        stop = torch.cuda.Event(enable_timing=True)
        start.record()
        torch.topk(x.abs(), k)
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    times.sort()
    return times[len(times) // 2]


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    default_bench = os.path.join(here, "..", "..", "build", "bench", "bench_cuda_sparse")
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bench", default=default_bench, help="path of the bench_cuda_sparse executable")
    ap.add_argument("--sizes", default="1M,16M,128M")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--json", help="write the combined table as JSON")
    args = ap.parse_args()

    try:
        import numpy as np
        import torch
    except ImportError as e:
        print(f"no CUDA device: torch/numpy unavailable ({e})")
        return 0
    if not torch.cuda.is_available():
        print("no CUDA device: torch.cuda.is_available() is False")
        return 0
    if not os.access(args.bench, os.X_OK):
        print(f"torch_topk.py: {args.bench} is not an executable (build bench_cuda_sparse, pass --bench)",
              file=sys.stderr)
        return 2

    rows = []
    rng = np.random.default_rng(42)
    with tempfile.TemporaryDirectory() as tmp:
        for size_text in args.sizes.split(","):
            n = parse_size(size_text)
            data = rng.standard_normal(n, dtype=np.float32)
            path = os.path.join(tmp, f"grad_{n}.f32")
            data.tofile(path)
            x = torch.from_numpy(data).cuda()
            ours_json = os.path.join(tmp, f"ours_{n}.json")
            subprocess.run([args.bench, "--input", path, "--json", ours_json, "--iters", str(args.iters),
                            "--warmup", str(args.warmup)], check=True, stdout=subprocess.DEVNULL)
            with open(ours_json) as f:
                ours = json.load(f)
            for ratio in (0.01, 0.001):
                k = max(1, int(ratio * n))
                torch_ms = time_torch_topk(torch, x, k, args.warmup, args.iters)
                for op in ("topk exact", "topk sample"):
                    mine = [r for r in ours if r["op"] == op and abs(r["ratio"] - ratio) < 1e-12]
                    if not mine:
                        continue
                    rows.append({"n": n, "ratio": ratio, "op": op, "torch_ms": torch_ms, "ours_ms": mine[0]["ms"],
                                 "speedup": torch_ms / mine[0]["ms"], "device": mine[0]["device"]})
            del x
            torch.cuda.empty_cache()

    print(f"# device: {rows[0]['device'] if rows else '?'}; torch {torch.__version__}; "
          f"speedup = torch.topk(x.abs(), k) ms / ours ms")
    print(f"{'n':>12} {'ratio':>7} {'op':<12} {'torch ms':>10} {'ours ms':>10} {'speedup':>8}")
    for r in rows:
        print(f"{r['n']:>12} {r['ratio']:>7} {r['op']:<12} {r['torch_ms']:>10.4f} {r['ours_ms']:>10.4f} "
              f"{r['speedup']:>7.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
