"""Rank program: gradcomm.init() before torch.distributed.init_process_group, with
only MASTER_ADDR/MASTER_PORT to go by (no GRADCOMM_STORE, as under a plain
launcher). torch must still get MASTER_PORT (its env:// store binds it on rank 0),
and both libraries must then work side by side. Prints 'OK init-order rank=R'."""
import datetime
import os

os.environ.pop("GRADCOMM_STORE", None)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import gradcomm  # noqa: E402

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
print(f"OK init-order rank={r}", flush=True)
