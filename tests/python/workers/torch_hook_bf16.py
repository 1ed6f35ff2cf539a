"""Rank program: DDP over gloo with a bfloat16 model on CPU and compression_hook
(quant:bits=8, from iteration 1). The hook compresses the bfloat16 buckets as they are
(the codecs take float16/bfloat16 CPU tensors: no float32 copy, no dense fallback):
4 of 5 reductions compressed, fewer bytes sent than the dense ring's, and the replicas
bitwise identical. Prints 'OK torch-hook-bf16 rank=R'."""
import warnings

import torch
import torch.distributed as dist
import torch.nn as nn

import gradcomm
from gradcomm.torch import CompressionHookState, compression_hook

warnings.simplefilter("error")  # no "reduced dense" warning
dist.init_process_group("gloo")
r = dist.get_rank()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10)).to(torch.bfloat16)
ddp = nn.parallel.DistributedDataParallel(model)
state = CompressionHookState("quant:bits=8", start_iter=1)
ddp.register_comm_hook(state, compression_hook)
opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
g = torch.Generator().manual_seed(r)
for step in range(5):
    x = torch.randn(32, 64, generator=g).to(torch.bfloat16)
    loss = ddp(x).float().pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
st = state.stats()
assert st["reductions"] == 5 and st["compressed_reductions"] == 4, st
# The dense baseline is the bfloat16 bytes: 2 (N-1)/N x 2 bytes x the bucket, per call.
numel = sum(p.numel() for p in model.parameters())
assert st["dense_ring_bytes"] == 5 * 2 * numel, (st, numel)
assert st["bytes_sent"] < 0.7 * st["dense_ring_bytes"], st
flat = torch.cat([p.detach().float().reshape(-1) for p in ddp.parameters()])
everyone = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
dist.all_gather(everyone, flat)
assert all(torch.equal(everyone[0], e) for e in everyone), "replicas differ"
assert torch.isfinite(flat).all()
dist.destroy_process_group()
print(f"OK torch-hook-bf16 rank={r}", flush=True)
