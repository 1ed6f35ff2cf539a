"""Rank program: DDP on the "gradcomm" process group. argv[1]:
  nohook  DDP with no hook, compression from pg_options (argv[2], e.g. topk:ratio=0.01)
  hook    DDP on the gradcomm group with gradcomm's compression_hook registered
Trains a small MLP on rank-specific data and checks, after every step, that the
parameters are bitwise identical on every rank. The check goes through torch's
store (each rank's parameter bytes under a key), not through the backend under
test. Also checks that the parameters moved and the loss fell.
Prints 'OK torch-backend-ddp rank=R'."""
import datetime

import nodes  # noqa: F401  (first: GRADCOMM_NODE, when the test asks for nodes)
import hashlib
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import gradcomm
import gradcomm.torch as gtorch

mode = sys.argv[1]
spec = sys.argv[2] if len(sys.argv) > 2 else "none"
STEPS = 30
torch.set_num_threads(1)
options = gtorch.ProcessGroupOptions(compression=spec if mode == "nohook" else "none")
dist.init_process_group("gradcomm", timeout=datetime.timedelta(seconds=60), pg_options=options)
r, n = dist.get_rank(), dist.get_world_size()
store = dist.distributed_c10d._get_default_store()

torch.manual_seed(r)  # different initial weights per rank: DDP's constructor must broadcast rank 0's
model = nn.Sequential(nn.Linear(32, 256), nn.Tanh(), nn.Linear(256, 64), nn.Tanh(), nn.Linear(64, 4))
model.register_buffer("seen", torch.full((2,), float(r)))  # a buffer: broadcast too
ddp = DDP(model, bucket_cap_mb=0.05)  # several buckets
if mode == "hook":
    ddp.register_comm_hook(gtorch.CompressionHookState(compression=spec), gtorch.compression_hook)
opt = torch.optim.SGD(ddp.parameters(), lr=0.05)


def digest():
    h = hashlib.sha256()
    for p in list(model.parameters()) + list(model.buffers()):
        h.update(p.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def same_everywhere(tag):
    store.set(f"check/{tag}/{r}", digest())
    mine = digest()
    for q in range(n):
        store.wait([f"check/{tag}/{q}"], datetime.timedelta(seconds=30))
        theirs = store.get(f"check/{tag}/{q}").decode()
        assert theirs == mine, f"{tag}: rank {q}'s parameters differ from rank {r}'s"


same_everywhere("init")
assert torch.equal(model.seen, torch.zeros(2)), "DDP did not broadcast rank 0's buffer"
start = [p.detach().clone() for p in model.parameters()]
g = torch.Generator().manual_seed(7)
teacher = torch.randn(32, 4, generator=g)
data = torch.Generator().manual_seed(100 + r)
losses = []
for step in range(STEPS):
    x = torch.randn(64, 32, generator=data)
    loss = nn.functional.mse_loss(ddp(x), x @ teacher)
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses.append(loss.item())
    same_everywhere(f"step{step}")
# (top-k at 1% may leave a small tensor untouched for a while: the model as a whole must move.)
assert any(not torch.equal(a, p) for a, p in zip(start, model.parameters())), "the parameters never moved"
assert sum(losses[-5:]) < sum(losses[:5]), f"loss did not fall: {losses}"
print(f"OK torch-backend-ddp rank={r} loss {losses[0]:.3f} -> {losses[-1]:.3f} digest={digest()}", flush=True)
if mode == "hook":
    gradcomm.shutdown()
dist.destroy_process_group()
