"""Rank program (gradcomm-run): DistributedOptimizer when a layer has no gradient on
some ranks only. Four same-shaped layers without bias (so a wrongly paired
gradient cannot show up as a size mismatch); at each step a rank leaves out a layer
that depends on the step and the rank, the case of argv[1]:
  fixed    rank 1 never uses layer 1 (the others use every layer)
  varying  rank r leaves out layer (step + r) % 4 at even step + r, none otherwise
After every step the parameters must be bitwise identical on every rank (checked
through torch's store, not through gradcomm) and equal, bit for bit, a reference
computed here without any communication: every rank's gradients (a missing one as
zeros) averaged, then the same SGD step (SGD itself, so its rounding is the same).
Bit for bit holds at two ranks, where a sum of two does not depend on the order.
Prints 'OK torch-opt-unused rank=R'."""
import datetime
import faulthandler
import sys

import torch
import torch.distributed as dist
import torch.nn as nn

import gradcomm
from gradcomm.torch import DistributedOptimizer

faulthandler.dump_traceback_later(60, exit=True)  # a hang ends with every thread's stack
case = sys.argv[1]
STEPS, WIDTH, LAYERS = 8, 16, 4
torch.set_num_threads(1)
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
gradcomm.init()
r, n = gradcomm.rank(), gradcomm.size()
store = dist.distributed_c10d._get_default_store()


def skipped(rank, step):
    if case == "fixed":
        return 1 if rank == 1 else None
    return (step + rank) % LAYERS if (step + rank) % 2 == 0 else None


def make_model():
    torch.manual_seed(3)
    return nn.ModuleList(nn.Linear(WIDTH, WIDTH, bias=False) for _ in range(LAYERS))


def forward(layers, x, skip):
    for i, layer in enumerate(layers):
        if i != skip:
            x = torch.tanh(layer(x))
    return x.sum()


def batch(rank, step):
    return torch.randn(8, WIDTH, generator=torch.Generator().manual_seed(1000 * step + rank))


model, reference = make_model(), make_model()
reference_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters())
for step in range(STEPS):
    opt.zero_grad(set_to_none=True)
    forward(model, batch(r, step), skipped(r, step)).backward()
    opt.step()

    # The reference: each rank's gradient computed here, a missing one as zeros.
    grads = [torch.zeros_like(p) for p in reference.parameters()]
    for q in range(n):
        reference.zero_grad(set_to_none=True)
        forward(reference, batch(q, step), skipped(q, step)).backward()
        for g, p in zip(grads, reference.parameters()):
            if p.grad is not None:
                g += p.grad
    for g, p in zip(grads, reference.parameters()):
        p.grad = g / n
    reference_opt.step()

    mine = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    expected = torch.cat([p.detach().reshape(-1) for p in reference.parameters()])
    assert torch.equal(mine, expected), \
        f"{case} step {step}: rank {r} differs from the reference by {(mine - expected).abs().max().item()}"
    store.set(f"unused/{case}/{step}/{r}", mine.numpy().tobytes())
    for q in range(n):
        store.wait([f"unused/{case}/{step}/{q}"], datetime.timedelta(seconds=30))
        assert store.get(f"unused/{case}/{step}/{q}") == mine.numpy().tobytes(), \
            f"{case} step {step}: rank {q}'s parameters differ from rank {r}'s"

print(f"OK torch-opt-unused rank={r}", flush=True)
gradcomm.shutdown()
dist.barrier()  # rank 0 serves torch's store: stay until every rank has read its keys
