"""Rank program: compressor=auto on the "gradcomm" backend, a fresh tensor every call
(a new storage, so a new key each time), CALLS calls after WARMUP: the process's RSS
must not grow with the keys (issue 42: ~1.5 KB per call, +31 MB over 20,000 calls,
before auto's per-key measurements went with the key the backend's sweep drops).
Prints 'OK torch-backend-auto-keys rank=R growth_kib=G per_call_bytes=B'."""
import datetime
import faulthandler
import sys

import torch
import torch.distributed as dist

import gradcomm.torch as gtorch

calls, warmup, numel = (int(a) for a in sys.argv[1:4])
faulthandler.dump_traceback_later(600, exit=True)
options = gtorch.ProcessGroupOptions(compression="auto", min_compress_numel=0)
dist.init_process_group("gradcomm", timeout=datetime.timedelta(seconds=120), pg_options=options)
r, n = dist.get_rank(), dist.get_world_size()


def rss_kib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4  # resident pages of 4 KiB


def run(count, seed):
    g = torch.Generator().manual_seed(seed + r)
    for _ in range(count):
        x = torch.randn(numel, generator=g)  # a fresh storage: a key of its own
        dist.all_reduce(x)
        assert torch.isfinite(x).all()


run(warmup, 1)
before = rss_kib()
run(calls, 2)
after = rss_kib()
print(f"OK torch-backend-auto-keys rank={r} growth_kib={after - before} "
      f"per_call_bytes={(after - before) * 1024 / calls:.1f} before_kib={before} after_kib={after}", flush=True)
dist.destroy_process_group()
