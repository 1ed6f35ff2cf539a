"""Rank program (gradcomm-run or torchrun): trains a small MLP with gradcomm's DDP
hook and with DistributedOptimizer over a gloo process group, and checks after
every step that the parameters are bitwise identical on every rank, that the loss
falls, and (compression "none") that the parameters equal those of plain DDP /
torch.distributed within fp32 tolerance.

argv: scenarios MODE:SPEC, MODE ddp (start_iter=1), ddp0 (start_iter=0), ddpbig (one
large bucket: the hook's future must still be running when the hook returns), opt,
or optclip (synchronize + clip + skip_synchronize, after broadcast_parameters and
broadcast_optimizer_state from rank-dependent starts),
e.g. "ddp:topk:ratio=0.05 ddp0:topk:ratio=0.05 opt:qsgd:levels=16 ddp:none"
Prints 'OK torch rank=R' when all hold."""
import os
import copy
import datetime
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import gradcomm
from gradcomm.torch import (CompressionHookState, DistributedOptimizer, broadcast_optimizer_state,
                            broadcast_parameters, compression_hook)

STEPS = 25
torch.set_num_threads(1)
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
gradcomm.init()
r, n = gradcomm.rank(), gradcomm.size()
assert (r, n) == (dist.get_rank(), dist.get_world_size())
# The rendezvous went through torch's store (no second port): our keys are there
# (communicator generation 1's namespace, store/rendezvous.h).
assert gradcomm._init_source == "torch.distributed", gradcomm._init_source
store = dist.distributed_c10d._get_default_store()
for q in range(n):
    store.wait([f"gradcomm/init0/gradcomm/g1/comm/ucx/addr/{q}"], datetime.timedelta(seconds=5))


def make_model(seed):
    torch.manual_seed(seed)  # the same initial weights on every rank
    return nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 4))


def batches(seed):
    """Rank-specific data of a fixed linear teacher: every rank a different shard."""
    g = torch.Generator().manual_seed(seed)
    teacher = torch.randn(32, 4, generator=g)
    data_g = torch.Generator().manual_seed(seed * 1000 + r + 1)
    for _ in range(STEPS):
        x = torch.randn(64, 32, generator=data_g)
        yield x, x @ teacher


def flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def check_identical(model, what):
    mine = flat(model).contiguous()
    everyone = gradcomm.allgather(mine)
    for q in range(n):
        assert torch.equal(everyone[q], mine), f"{what}: rank {q}'s parameters differ from rank {r}'s"


def check_loss_falls(losses, what):
    first, last = sum(losses[:3]) / 3, sum(losses[-3:]) / 3
    assert last < 0.6 * first, f"{what}: loss did not fall: {first:.4f} -> {last:.4f} ({losses})"


def run_ddp(compression, start_iter):
    model = make_model(1)
    # Small buckets (the first one too): several of them, so per-bucket keys and
    # DDP's bucket rebuild after the first iteration are exercised.
    dist._DEFAULT_FIRST_BUCKET_BYTES = 4096
    ddp = DDP(model, bucket_cap_mb=0.004)
    state = CompressionHookState(compression=compression, start_iter=start_iter)
    ddp.register_comm_hook(state, compression_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.5)
    ref = ref_opt = None
    if compression == "none":  # plain DDP (gloo allreduce) from the same start
        ref = DDP(make_model(1), bucket_cap_mb=0.004)
        ref_opt = torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.5)
    losses, keys_after = [], []
    n_params = sum(p.numel() for p in model.parameters())
    for step, (x, y) in enumerate(batches(7)):
        sent0 = gradcomm.stats()["bytes_sent"] if gradcomm.is_initialized() else 0
        opt.zero_grad()
        loss = nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if compression.startswith("powersgd") and step == STEPS - 1:
            # The hook passed each parameter's shape: the two weight matrices went as
            # rank-2 factors, well under the dense buffer (all dense: >= 1x its bytes).
            sent = gradcomm.stats()["bytes_sent"] - sent0
            assert sent < 0.4 * 4 * n_params, f"ddp {compression}: {sent} bytes in a step, {4 * n_params} dense"
        check_identical(model, f"ddp {compression} step {step}")
        keys_after.append(set(state.keys))
        if ref is not None:
            ref_opt.zero_grad()
            nn.functional.mse_loss(ref(x), y).backward()
            ref_opt.step()
            diff = (flat(model) - flat(ref.module)).abs().max().item()
            assert torch.allclose(flat(model), flat(ref.module), rtol=1e-5, atol=1e-6), \
                f"ddp none step {step}: differs from plain DDP by {diff}"
    check_loss_falls(losses, f"ddp {compression}")
    assert state.iter == STEPS, state.iter
    # The hook's stats: every bucket counted, its dense baseline a ring's 2(N-1)/N of its bytes.
    st = state.stats()
    bucket_bytes = 4 * n_params  # float32 gradients, every parameter in some bucket each step
    assert st["reduced_bytes"] == STEPS * bucket_bytes, (st, bucket_bytes)
    # (each bucket's 2(N-1)/N rounds down: at most a byte per bucket off the whole's)
    assert 0 <= STEPS * 2 * (n - 1) * bucket_bytes / n - st["dense_ring_bytes"] <= st["reductions"], st
    if compression == "none":
        assert st["compressed_reductions"] == 0, st
    else:  # the first start_iter iterations dense
        assert 0 < st["compressed_reductions"] == st["reductions"] or start_iter > 0, st
        assert st["compressed_reductions"] < st["reductions"] or start_iter == 0, st
    assert "bytes_sent" in st, st
    if compression != "none":
        # One key per bucket DDP uses; after the rebuild (from the second iteration
        # on) no new key appears: error feedback follows the same gradients.
        assert len(keys_after[0]) == (0 if start_iter > 0 else len(keys_after[0])), keys_after[0]
        assert len(keys_after[1] - keys_after[0]) >= 2, keys_after[1]
        assert all(k == keys_after[1] for k in keys_after[1:]), (keys_after[1], keys_after[-1])
        if r == 0:
            print(f"ddp {compression} start_iter={start_iter}: keys {sorted(keys_after[-1])}", flush=True)
    return losses


def run_opt(compression):
    model = make_model(2)
    base = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.5)
    opt = DistributedOptimizer(base, named_parameters=model.named_parameters(), compression=compression)
    assert isinstance(opt, torch.optim.SGD)
    ref = ref_opt = None
    if compression == "none":
        ref = DDP(make_model(2))
        ref_opt = torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.5)
    losses = []
    for step, (x, y) in enumerate(batches(11)):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        check_identical(model, f"opt {compression} step {step}")
        if ref is not None:
            ref_opt.zero_grad()
            nn.functional.mse_loss(ref(x), y).backward()
            ref_opt.step()
            diff = (flat(model) - flat(ref.module)).abs().max().item()
            assert torch.allclose(flat(model), flat(ref.module), rtol=1e-5, atol=1e-6), \
                f"opt none step {step}: differs from DDP by {diff}"
    check_loss_falls(losses, f"opt {compression}")
    return losses


def run_ddp_big(compression):
    """One 32 MiB bucket: the hook must return before the allreduce is done (DDP
    then overlaps backward with it), and the result must still be right. (Large,
    so that even a rank descheduled for a while on a loaded machine sees it so.)"""
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(4096, 2048), nn.Tanh(), nn.Linear(2048, 4))
    ddp = DDP(model, bucket_cap_mb=256)
    state = CompressionHookState(compression=compression, start_iter=0)
    pending_at_return = []

    def hook(st, bucket):
        future = compression_hook(st, bucket)
        if bucket.buffer().numel() >= 1 << 20:
            pending_at_return.append(not future.done())
        return future

    ddp.register_comm_hook(state, hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(5 + r)
    losses = []
    for step in range(4):
        x = torch.randn(8, 4096, generator=g)
        opt.zero_grad()
        loss = (ddp(x) ** 2).mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        check_identical(model, f"ddpbig {compression} step {step}")
    # A blocking hook returns a completed future every time. A rank that is descheduled
    # right after issuing may, on a loaded machine, find the call already done; one step
    # of four still running at return is the proof that the hook does not block.
    assert len(pending_at_return) == 4 and any(pending_at_return), \
        f"ddpbig {compression}: the hook's future was already complete when it returned: {pending_at_return}"
    return losses


def run_opt_clip(compression):
    """Ranks start apart; broadcast_parameters and broadcast_optimizer_state bring
    them together; then synchronize() + clipping + skip_synchronize()."""
    model = make_model(100 + r)  # a different start on every rank
    base = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.5)
    if r == 0:  # only rank 0 has optimizer state (momentum), as after loading a checkpoint
        for p in model.parameters():
            p.grad = torch.ones_like(p)
        base.step()
    broadcast_parameters(model.state_dict(), root_rank=0)
    check_identical(model, "optclip after broadcast_parameters")
    opt = DistributedOptimizer(base, named_parameters=model.named_parameters(), compression=compression)
    broadcast_optimizer_state(opt, root_rank=0)
    momentum = torch.cat([opt.state[p]["momentum_buffer"].reshape(-1) for p in model.parameters()])
    everyone = gradcomm.allgather(momentum.contiguous())
    assert all(torch.equal(everyone[q], momentum) for q in range(n)), "optclip: momentum differs after broadcast"
    losses = []
    for step, (x, y) in enumerate(batches(13)):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.synchronize()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        with opt.skip_synchronize():
            opt.step()
        losses.append(loss.item())
        check_identical(model, f"optclip {compression} step {step}")
    try:  # two backwards without a step in between are refused, not silently summed
        nn.functional.mse_loss(model(x), y).backward()
        nn.functional.mse_loss(model(x), y).backward()
        raise SystemExit("optclip: a second backward before step() was accepted")
    except RuntimeError as e:
        assert "second gradient" in str(e), e
    opt.synchronize()
    return losses


assert gradcomm.local_rank() == int(os.environ.get("LOCAL_RANK", r)), (gradcomm.local_rank(), os.environ)

for scenario in sys.argv[1:]:
    mode, compression = scenario.split(":", 1)
    if mode in ("ddp", "ddp0"):
        losses = run_ddp(compression, start_iter=1 if mode == "ddp" else 0)
    elif mode == "ddpbig":
        losses = run_ddp_big(compression)
    elif mode == "opt":
        losses = run_opt(compression)
    elif mode == "optclip":
        losses = run_opt_clip(compression)
    else:
        raise SystemExit(f"unknown mode {mode}")
    if r == 0:
        print(f"{scenario}: loss {losses[0]:.4f} -> {losses[-1]:.4f}", flush=True)

gradcomm.shutdown()
dist.destroy_process_group()
print(f"OK torch rank={r}", flush=True)
