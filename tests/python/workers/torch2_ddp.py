"""Rank program for issue 31's must-show check, under torchrun with 2 ranks. argv[1]:
  backend  DDP on init_process_group("gradcomm") with
           gradcomm.torch.set_compression(dist.group.WORLD, "topk:ratio=0.01"), no hook
  hook     DDP over gloo with gradcomm.torch.compression_hook (top-k 1%)
Both train a small MLP for 5 steps on rank-specific data and then check, through
torch's store (not through the backend under test), that the parameters are bitwise
identical on both ranks. Then a plain all_reduce: integers and a small float32 metric
(below the group's min_compress_numel) must equal the closed-form sums exactly. For
"backend" the group's counters must show the compressor ran (fewer bytes on the wire
than a dense ring). Prints 'OK torch2-ddp rank=R mode=M digest=D'."""
import datetime
import hashlib
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import gradcomm.torch as gtorch

mode = sys.argv[1]
STEPS = 5
torch.set_num_threads(1)
dist.init_process_group("gradcomm" if mode == "backend" else "gloo", timeout=datetime.timedelta(seconds=60))
r, n = dist.get_rank(), dist.get_world_size()
if mode == "backend":
    gtorch.set_compression(dist.group.WORLD, "topk:ratio=0.01")
store = dist.distributed_c10d._get_default_store()

torch.manual_seed(r)  # different initial weights: DDP must broadcast rank 0's
model = nn.Sequential(nn.Linear(64, 256), nn.Tanh(), nn.Linear(256, 64), nn.Tanh(), nn.Linear(64, 4))
ddp = DDP(model, bucket_cap_mb=0.1)  # several buckets
if mode == "hook":
    ddp.register_comm_hook(gtorch.CompressionHookState(compression="topk:ratio=0.01", start_iter=0),
                           gtorch.compression_hook)
opt = torch.optim.SGD(ddp.parameters(), lr=0.05)


def digest():
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def same_everywhere(tag):
    mine = digest()
    store.set(f"check/{tag}/{r}", mine)
    for q in range(n):
        store.wait([f"check/{tag}/{q}"], datetime.timedelta(seconds=30))
        theirs = store.get(f"check/{tag}/{q}").decode()
        assert theirs == mine, f"{tag}: rank {q}'s parameters differ from rank {r}'s"
    return mine


same_everywhere("init")
start = [p.detach().clone() for p in model.parameters()]
data = torch.Generator().manual_seed(100 + r)
teacher = torch.randn(64, 4, generator=torch.Generator().manual_seed(7))
for step in range(STEPS):
    x = torch.randn(32, 64, generator=data)
    loss = nn.functional.mse_loss(ddp(x), x @ teacher)
    opt.zero_grad()
    loss.backward()
    opt.step()
final = same_everywhere("final")
assert any(not torch.equal(a, p.detach()) for a, p in zip(start, model.parameters())), "the parameters never moved"

if mode == "backend":
    # The training's counters (DDP's initial broadcast and shape check included).
    s = gtorch.stats()
    assert s["compressed_reductions"] >= STEPS, s  # DDP's buckets went through top-k
    # What left this rank: the wire, and on one host's segment what it wrote there (a call
    # there sends nothing over the wire, its header neither: docs/shared-memory.md).
    moved = s["bytes_sent"] + s["node_shm_bytes"]
    assert 0 < moved < s["dense_ring_bytes"] / 4, s
    print(f"rank {r} stats: sent {moved} B, dense ring {s['dense_ring_bytes']} B, "
          f"{s['compressed_reductions']}/{s['reductions']} reductions compressed", flush=True)

# A plain all_reduce is exact: int64 (never compressed) and a float32 metric below
# min_compress_numel; both against closed-form sums.
ints = torch.arange(100_000, dtype=torch.int64) * (r + 1)
dist.all_reduce(ints)
assert torch.equal(ints, torch.arange(100_000, dtype=torch.int64) * sum(q + 1 for q in range(n))), "int64 all_reduce"
metric = torch.full((1000,), 0.1 * (r + 1), dtype=torch.float32)
expect = sum(torch.full((1000,), 0.1 * (q + 1), dtype=torch.float32) for q in range(n))
dist.all_reduce(metric)
assert torch.equal(metric, expect), f"float32 metric all_reduce: {metric[:3]} != {expect[:3]}"

dist.destroy_process_group()
print(f"OK torch2-ddp rank={r} mode={mode} torch={torch.__version__} digest={final}", flush=True)
