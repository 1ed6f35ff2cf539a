"""Rank program: gradcomm.init() before torch.distributed.init_process_group, with
only MASTER_ADDR/MASTER_PORT to go by (no GRADCOMM_STORE, as under a plain
launcher). torch must still get MASTER_PORT (its env:// store binds it on rank 0),
and both libraries must then work side by side. Prints 'OK init-order rank=R'.

With the argument "hold-next-port" (run under torchrun, c10d rendezvous): MASTER_PORT
is a port the agent released, and MASTER_PORT + 1 belongs to nobody. Rank 0 holds
MASTER_PORT + 1 (as an outgoing connection or another job may) before gradcomm.init();
gradcomm must not need it. (torch 2.x's agent serves its store on MASTER_PORT itself,
TORCHELASTIC_USE_AGENT_STORE=True: the same must hold there.)"""
import datetime
import os
import socket
import sys

os.environ.pop("GRADCOMM_STORE", None)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import gradcomm  # noqa: E402

held = None
if "hold-next-port" in sys.argv[1:] and os.environ["RANK"] == "0":
    held = socket.socket()
    held.bind((os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]) + 1))
    held.listen(1)
gradcomm.init()
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))  # "Address already in use" before
r, n = gradcomm.rank(), gradcomm.size()
assert (r, n) == (dist.get_rank(), dist.get_world_size())
x = torch.full((1000,), float(r + 1))
y = x.clone()
gradcomm.allreduce(x)
dist.all_reduce(y)
assert torch.equal(x, y), (x[:4], y[:4])
work = gradcomm.allreduce_async(x)
assert work.wait() is x
dist.destroy_process_group()
gradcomm.shutdown()
if held is not None:
    held.close()
print(f"OK init-order rank={r}", flush=True)
