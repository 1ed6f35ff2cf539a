"""Data-parallel training without DDP: gradcomm's Horovod-style DistributedOptimizer.

    gradcomm-run -n 2 -- /usr/bin/python3 distributed_optimizer.py --compression qsgd:levels=16
    torchrun --standalone --nproc_per_node=2 distributed_optimizer.py

No torch.distributed here: gradcomm.init() rendezvous through the launcher's
environment (GRADCOMM_STORE from gradcomm-run; MASTER_ADDR/MASTER_PORT from torchrun).
"""
import argparse

import torch
import torch.nn as nn

import gradcomm
from gradcomm.torch import DistributedOptimizer

parser = argparse.ArgumentParser()
parser.add_argument("--compression", default="topk:ratio=0.05")
parser.add_argument("--steps", type=int, default=50)
parser.add_argument("--lr", type=float, default=0.05)
args = parser.parse_args()

gradcomm.init()
rank, size = gradcomm.rank(), gradcomm.size()

model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 8))
for p in model.parameters():  # start every rank from rank 0's weights
    gradcomm.broadcast(p.data, root=0)

opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.5),
                           named_parameters=model.named_parameters(), compression=args.compression)

teacher = torch.randn(64, 8, generator=torch.Generator().manual_seed(1))
data = torch.Generator().manual_seed(100 + rank)
for step in range(args.steps):
    x = torch.randn(128, 64, generator=data)
    loss = nn.functional.mse_loss(model(x), x @ teacher)
    opt.zero_grad()
    loss.backward()
    opt.step()  # averages each gradient over all ranks (compressed, keyed by name), then steps
    if rank == 0 and (step % 10 == 0 or step == args.steps - 1):
        print(f"step {step:3d}  loss {loss.item():.4f}", flush=True)

mine = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
everyone = gradcomm.allgather(mine)
assert all(torch.equal(everyone[0], everyone[r]) for r in range(size))
print(f"rank {rank}: done, parameters identical on all {size} ranks", flush=True)
gradcomm.shutdown()
