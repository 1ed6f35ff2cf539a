"""Rank program (under gradcomm-run; torch 1.13 and 2.x): PREMUL_SUM on the "gradcomm" backend
(issue 44 item 2). Rank r contributes (r + 1) * v, so PREMUL_SUM(f) = f * total * v:
  - all_reduce and reduce_scatter_tensor / reduce_scatter with a number and a
    one-element tensor as the factor, dense: exact, the reduce-scatter's input unchanged;
  - compressed (fp16, deterministic): bitwise what SUM gives on the input multiplied by f;
  - an integer tensor refused by name;
  - torch >= 2: FSDP2 (fully_shard) with set_gradient_divide_factor(4.0) on every FSDP module and the
    learning rate doubled equals (factor 2N: 4.0 at N = 2), to 1e-6, the run with the default factor (plain SGD).
Prints 'OK torch-premul rank=R max_diff=D'."""
import datetime

import torch
import torch.distributed as dist
import torch.nn as nn

import gradcomm.torch as gtorch

torch.set_num_threads(1)
dist.init_process_group("gradcomm", timeout=datetime.timedelta(seconds=60))
r, n = dist.get_rank(), dist.get_world_size()
coef = r + 1
total = n * (n + 1) // 2


def premul(f):
    if callable(dist.ReduceOp.PREMUL_SUM):  # torch 2.x
        return dist.ReduceOp.PREMUL_SUM(f)
    return dist._make_nccl_premul_sum([f] if torch.is_tensor(f) else f)  # 1.13: one tensor per device


# ---- dense, exact ------------------------------------------------------------------------
for factor in (0.25, torch.tensor([0.25])):
    t = torch.arange(8.0) * coef
    dist.all_reduce(t, op=premul(factor))
    assert torch.equal(t, torch.arange(8.0) * total * 0.25), (factor, t)

    inp = torch.arange(4.0 * n) * coef
    kept = inp.clone()
    out = torch.empty(4)
    dist.reduce_scatter_tensor(out, inp, op=premul(factor))
    assert torch.equal(out, torch.arange(4.0 * r, 4.0 * r + 4) * total * 0.25), (factor, out)
    assert torch.equal(inp, kept), "reduce_scatter_tensor changed its input"

    chunks = [torch.arange(3.0) * coef + 10 * q for q in range(n)]
    out = torch.empty(3)
    dist.reduce_scatter(out, chunks, op=premul(factor))
    assert torch.allclose(out, (torch.arange(3.0) * total + 10 * r * n) * 0.25), (factor, out)

t64 = torch.arange(5, dtype=torch.float64) * coef
dist.all_reduce(t64, op=premul(0.5))
assert torch.equal(t64, torch.arange(5, dtype=torch.float64) * total * 0.5), t64

try:
    dist.all_reduce(torch.ones(3, dtype=torch.int64), op=premul(2.0))
    raise AssertionError("PREMUL_SUM on an int64 tensor was accepted")
except (ValueError, RuntimeError) as e:
    assert "PREMUL_SUM on a Long tensor" in str(e), e

# ---- compressed: PREMUL_SUM(f) is SUM of f * x, bit for bit ----------------------------------
fp16 = dist.new_group(list(range(n)), backend="gradcomm", pg_options=gtorch.ProcessGroupOptions("fp16"))
g = torch.sin(torch.arange(2048.0) * 0.37 * coef)
for factor in (0.5, torch.tensor([0.5])):
    a, b = g.clone(), g * 0.5
    dist.all_reduce(a, op=premul(factor), group=fp16)
    dist.all_reduce(b, op=dist.ReduceOp.SUM, group=fp16)
    assert torch.equal(a, b), (a - b).abs().max()
    oa, ob = torch.empty(2048 // n), torch.empty(2048 // n)
    ga = g[:2048 // n * n].clone()
    dist.reduce_scatter_tensor(oa, ga, op=premul(factor), group=fp16)
    dist.reduce_scatter_tensor(ob, ga * 0.5, op=dist.ReduceOp.SUM, group=fp16)
    assert torch.equal(oa, ob), (oa - ob).abs().max()
    assert torch.equal(ga, g[:2048 // n * n]), "compressed reduce_scatter_tensor changed its input"
stats = gtorch.stats(fp16)
assert stats["compressed_reductions"] == stats["reductions"] == 8, stats

# ---- FSDP2's set_gradient_divide_factor (torch >= 2) ------------------------------------------------
if int(torch.__version__.split(".")[0]) < 2:
    dist.destroy_process_group()
    print(f"OK torch-premul rank={r} max_diff=none (torch {torch.__version__} has no FSDP2)")
    raise SystemExit(0)
from torch.distributed.fsdp import fully_shard  # noqa: E402


def train(divide_factor, lr):
    torch.manual_seed(5)
    model = nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, 4))
    modules = [fully_shard(layer) for layer in model if isinstance(layer, nn.Linear)] + [fully_shard(model)]
    if divide_factor is not None:
        for m in modules:
            m.set_gradient_divide_factor(divide_factor)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    data = torch.Generator().manual_seed(100 + r)
    for _ in range(6):
        x = torch.randn(16, 20, generator=data)
        y = torch.randint(0, 4, (16,), generator=data)
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return [p.full_tensor().detach().clone() for p in model.parameters()]


default = train(None, 0.1)
divided = train(2.0 * n, 0.2)  # the default divides by n; by 2n (4.0 at N = 2) halves every gradient
max_diff = max((a - b).abs().max().item() for a, b in zip(default, divided))
assert max_diff <= 1e-6, f"divide factor 4 with lr doubled differs from the default by {max_diff}"
moved = max((a - b).abs().max().item() for a, b in zip(default, train(2.0 * n, 0.1)))
assert moved > 1e-3, f"the divide factor changed nothing ({moved})"  # the comparison can fail

dist.destroy_process_group()
print(f"OK torch-premul rank={r} max_diff={max_diff:.3g}")
