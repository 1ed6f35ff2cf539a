#!/usr/bin/python3
"""Splits the CPU samples of DDP ranks (perf record --call-graph dwarf on their pids, then
`perf script -F comm,tid,ip,sym,dso`) by what the rank was doing:

    perf script -i perf.data -F comm,tid,ip,sym,dso > stacks.txt
    /usr/bin/python3 bench/e2e/perf_split.py stacks.txt [--cpu-ms 50]

Categories (from each sample's stack): inside gradcomm's allreduce (encode, decode, average,
transport and waiting, the rest), the hook's Python and binding glue around it, DDP's reducer
outside the hook (gradient copies into and out of buckets), GEMM (OpenBLAS), other torch
compute, the interpreter, the kernel. --cpu-ms (a rank's CPU ms per step, from the run's
record) turns shares into ms per step.
"""
import argparse
from collections import Counter

ENCODE = ("topk_select_accumulate", "accumulate_and_collect", "sample_keys", "radix_threshold", "select_exact",
          "encode_sparse", "zero_at", "accumulate_in_residual")
DECODE = ("decode_sum_sparse", "validate_sparse")
AVERAGE = ("divide_inplace",)
TRANSPORT = ("ucp_", "uct_", "ucs_", "spin_until_done", "UcxTransport", "ppoll", "epoll", "Op::send", "Op::recv",
             "ring_allgatherv")


def samples(path):
    """Yields each sample's frames (leaf first) as 'symbol (dso)' strings."""
    frames = []
    with open(path, errors="replace") as f:
        for line in f:
            if not line.strip():
                if frames:
                    yield frames
                frames = []
            elif line[0] in " \t":
                frames.append(line.strip().split(" ", 1)[1] if " " in line.strip() else line.strip())
            else:
                if frames:
                    yield frames
                frames = []
    if frames:
        yield frames


def classify(frames):
    stack = " | ".join(frames)
    leaf = frames[0]
    if "CommunicatorImpl::allreduce" in stack:
        for f in frames:  # the gradcomm function nearest the leaf decides
            if any(k in f for k in ENCODE):
                return "gradcomm: encode (top-k select, error feedback)"
            if any(k in f for k in DECODE):
                return "gradcomm: decode (check, scatter-add)"
            if any(k in f for k in AVERAGE):
                return "gradcomm: average (divide by N)"
            if any(k in f for k in TRANSPORT) or "[kernel" in f:
                return "gradcomm: transport, waiting (UCX, poll, kernel)"
        return "gradcomm: other (allocation, copies)"
    if "PythonCommHook::runHook" in stack:
        return "hook glue: Python, pybind11, future"
    if "c10d::Reducer" in stack:
        return "DDP reducer outside the hook (bucket copies)"
    if "libopenblas" in leaf:
        return "GEMM (OpenBLAS)"
    if "[kernel" in leaf:
        return "kernel, outside gradcomm"
    if "python3" in leaf:
        return "Python interpreter, outside the hook"
    if "libtorch" in stack or "libc10" in stack:
        return "other torch (autograd, elementwise, optimizer)"
    return "other"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("stacks")
    ap.add_argument("--cpu-ms", type=float, help="a rank's CPU ms per step (the record's cpu_s_per_step)")
    a = ap.parse_args()
    counts = Counter(classify(s) for s in samples(a.stacks))
    total = sum(counts.values())
    print(f"| where ({total} samples) | share |" + (" ms per step and rank |" if a.cpu_ms else ""))
    print("|---|---|" + ("---|" if a.cpu_ms else ""))
    for what, n in counts.most_common():
        share = n / total
        print(f"| {what} | {100 * share:.1f} % |" + (f" {share * a.cpu_ms:.1f} |" if a.cpu_ms else ""))


if __name__ == "__main__":
    main()
