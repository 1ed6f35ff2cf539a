"""Rank program under torchrun (c10d rendezvous): MASTER_PORT is a port the agent
released, and MASTER_PORT + 1 belongs to nobody. Rank 0 holds MASTER_PORT + 1 (as an
outgoing connection or another job may) before gradcomm.init(); gradcomm must not need
it, and torch.distributed's env:// init after it must still work. (torch 2.x's agent
serves its store on MASTER_PORT itself, TORCHELASTIC_USE_AGENT_STORE=True: the same
must hold there.) Prints
'OK torchrun-port rank=R'."""
import datetime
import os
import socket

import torch
import torch.distributed as dist

import gradcomm

held = None
if os.environ["RANK"] == "0":
    held = socket.socket()
    held.bind((os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]) + 1))
    held.listen(1)
gradcomm.init()
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
r, n = gradcomm.rank(), gradcomm.size()
assert (r, n) == (dist.get_rank(), dist.get_world_size())
x = torch.full((1000,), float(r + 1))
y = x.clone()
gradcomm.allreduce(x)
dist.all_reduce(y)
assert torch.equal(x, y), (x[:4], y[:4])
dist.destroy_process_group()
gradcomm.shutdown()
if held is not None:
    held.close()
print(f"OK torchrun-port rank={r}", flush=True)
