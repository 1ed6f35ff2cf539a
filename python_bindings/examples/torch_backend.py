"""DistributedDataParallel on the "gradcomm" torch.distributed backend, compressed
by the process group itself: no communication hook.

    gradcomm-run -n 2 -- /usr/bin/python3 torch_backend.py --compression topk:ratio=0.01
    torchrun --standalone --nproc_per_node=2 torch_backend.py
    (Debian's torch 1.13 on Python 3.11: add --redirects 1 --tee 1 to torchrun's options)

`import gradcomm.torch` registers the backend; the process group rendezvous
through torch.distributed's own store (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
from the launcher) and compresses DDP's float32 gradient buckets as pg_options
says. Each rank trains on its own shard of a synthetic regression task; at the end
every rank checks that all ranks hold bitwise the same parameters.
"""
import argparse
import hashlib

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import gradcomm.torch

parser = argparse.ArgumentParser()
parser.add_argument("--compression", default="topk:ratio=0.01")
parser.add_argument("--steps", type=int, default=50)
parser.add_argument("--lr", type=float, default=0.05)
args = parser.parse_args()

dist.init_process_group("gradcomm", pg_options=gradcomm.torch.ProcessGroupOptions(compression=args.compression))
rank, world = dist.get_rank(), dist.get_world_size()

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 8))
ddp = DDP(model)  # broadcasts rank 0's parameters; its bucket allreduces are compressed
opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.5)

teacher = torch.randn(64, 8, generator=torch.Generator().manual_seed(1))
data = torch.Generator().manual_seed(100 + rank)  # this rank's shard
for step in range(args.steps):
    x = torch.randn(128, 64, generator=data)
    loss = nn.functional.mse_loss(ddp(x), x @ teacher)
    opt.zero_grad()
    loss.backward()
    opt.step()
    if rank == 0 and (step % 10 == 0 or step == args.steps - 1):
        print(f"step {step:3d}  loss {loss.item():.4f}", flush=True)

# Every rank ends with the same parameters, bit for bit: gather each rank's digest.
digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).digest()
mine = torch.frombuffer(bytearray(digest), dtype=torch.uint8)
everyone = [torch.empty_like(mine) for _ in range(world)]
dist.all_gather(everyone, mine)
if not all(torch.equal(everyone[0], d) for d in everyone):
    raise SystemExit(f"rank {rank}: parameters differ across ranks")
print(f"rank {rank}: done, parameters bitwise identical on all {world} ranks "
      f"(compression {gradcomm.torch.backend().compression})", flush=True)
dist.destroy_process_group()
