"""DistributedDataParallel with gradcomm's compression hook (gloo process group).

    gradcomm-run -n 2 -- /usr/bin/python3 ddp_hook.py --compression topk:ratio=0.01
    torchrun --standalone --nproc_per_node=2 ddp_hook.py --compression qsgd:levels=16

Inside a torch.distributed job, gradcomm rendezvous through torch's own store:
no second port. Each rank trains on its own shard of a synthetic regression task.
"""
import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import gradcomm
from gradcomm.torch import CompressionHookState, compression_hook

parser = argparse.ArgumentParser()
parser.add_argument("--compression", default="topk:ratio=0.01")
parser.add_argument("--steps", type=int, default=50)
parser.add_argument("--lr", type=float, default=0.05)
args = parser.parse_args()

dist.init_process_group("gloo")  # RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from the launcher
gradcomm.init()                  # uses torch.distributed's store
rank = dist.get_rank()

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 8))
ddp = DDP(model)
ddp.register_comm_hook(CompressionHookState(compression=args.compression), compression_hook)
opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.5)

teacher = torch.randn(64, 8, generator=torch.Generator().manual_seed(1))
data = torch.Generator().manual_seed(100 + rank)  # this rank's shard
for step in range(args.steps):
    x = torch.randn(128, 64, generator=data)
    loss = nn.functional.mse_loss(ddp(x), x @ teacher)
    opt.zero_grad()
    loss.backward()  # the hook averages each gradient bucket over all ranks, compressed
    opt.step()
    if rank == 0 and (step % 10 == 0 or step == args.steps - 1):
        print(f"step {step:3d}  loss {loss.item():.4f}", flush=True)

# Every rank ends with the same parameters, bit for bit.
mine = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
everyone = gradcomm.allgather(mine)
assert all(torch.equal(everyone[0], everyone[r]) for r in range(gradcomm.size()))
print(f"rank {rank}: done, parameters identical on all {gradcomm.size()} ranks "
      f"({gradcomm.stats()['bytes_sent']} bytes sent by gradcomm)", flush=True)
gradcomm.shutdown()
# Free DDP before its process group: left to interpreter exit, DDP's reducer drops the gloo
# group's last reference with the GIL held, and torch 1.13's gloo destructor may then wait
# for a worker thread that needs the GIL (pytorch/pytorch#56297): a hang at exit.
del ddp, loss
dist.destroy_process_group()
