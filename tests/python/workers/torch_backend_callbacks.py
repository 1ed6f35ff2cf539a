"""Rank program: torch.futures callbacks on the "gradcomm" backend that issue
collectives and wait on them (the Future of an op must not complete on a thread that
such a callback blocks). argv[1]:
  chain     the chained callback of the issue (all_reduce(a).then(all_reduce(b).wait())),
            a three-deep chain, four chains one after another: exact sums; then four
            chains in flight at once: each exact, or refused on every rank (threads
            issuing concurrently), never a sum of two chains' numbers
  raise     a callback that raises: its error reaches the chained future's waiter, and
            the group goes on; a callback of a failed op (a mismatch) sees
            gradcomm.MismatchError
  powersgd  DDP with torch's own powerSGD_hook on the gradcomm group: parameters
            identical on every rank and equal, within fp32 reduction-order error, to
            the same training on a gloo group. One bucket: with several, the hook's
            callbacks issue their allreduces while backward issues the next buckets',
            in an order that differs between ranks, on gloo as on gradcomm
            (docs/fault-model.md)
  shutdown  a callback is blocked on a collective the peer never issues when rank 0
            destroys the group: the callback gets the error, and the destroy returns
Every wait runs under a watchdog (faulthandler): a hang ends within 60 s, with
every thread's stack. Prints 'OK torch-backend-callbacks rank=R'."""
import datetime
import faulthandler
import hashlib
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powerSGD
from torch.nn.parallel import DistributedDataParallel as DDP

import gradcomm
import gradcomm.torch  # noqa: F401  (registers the backend)

faulthandler.dump_traceback_later(60, exit=True)
kind = sys.argv[1]
torch.set_num_threads(1)
dist.init_process_group("gradcomm", timeout=datetime.timedelta(seconds=30))
r, n = dist.get_rank(), dist.get_world_size()
store = dist.distributed_c10d._get_default_store()
start = time.monotonic()


def chained(depth):
    """An all_reduce of ones whose callback waits on a chained(depth - 1) and adds:
    the result is (depth + 1) * n everywhere."""
    fut = dist.all_reduce(torch.ones(3), async_op=True).get_future()
    if depth == 0:
        return fut.then(lambda f: f.value()[0])
    return fut.then(lambda f: chained(depth - 1).wait() + f.value()[0])


if kind == "chain":
    a, b = torch.ones(4), torch.ones(4)
    fut = dist.all_reduce(a, async_op=True).get_future().then(
        lambda f: dist.all_reduce(b, async_op=True).get_future().wait()[0])
    assert torch.equal(fut.wait(), torch.full((4,), float(n))), fut.value()
    assert torch.equal(chained(2).wait(), torch.full((3,), 3.0 * n))
    for _ in range(4):  # chains one after another
        assert torch.equal(chained(1).wait(), torch.full((3,), 2.0 * n))

    # Four chains in flight at once: this thread's next all_reduces race the callbacks'
    # (work.h, "What no process group can order"). Each rank either issued them in one
    # order, or saw two threads' calls outstanding at once and refused, which aborts
    # every rank (src/engine.h, "Issuing threads"). Never a sum of two chains' numbers.
    def flight(k):
        fut = dist.all_reduce(torch.full((3,), k + 1.0), async_op=True).get_future()
        return fut.then(lambda f: dist.all_reduce(torch.full((3,), 10.0 * (k + 1)), async_op=True)
                        .get_future().wait()[0] + f.value()[0])

    # The refusal reaches whichever thread issues the refused call: a callback (then its
    # future fails) or this one, here (then the issue raises).
    futures, refused = [], 0
    for k in range(4):
        try:
            futures.append(flight(k))
        except gradcomm.Error as e:
            assert "issued on thread" in str(e), str(e)
            futures.append(None)
            refused += 1
    for k, f in enumerate(futures):
        if f is None:
            continue
        try:
            value = f.wait()
        except Exception as e:  # noqa: BLE001  (then() rewraps the callback's error)
            assert "issued on thread" in str(e), str(e)
            refused += 1
            continue
        assert torch.equal(value, torch.full((3,), 11.0 * (k + 1) * n)), (k, value)
    print(f"RESULT chains in flight rank={r}: {4 - refused} exact, {refused} refused", flush=True)
elif kind == "raise":
    def boom(f):
        dist.all_reduce(torch.ones(2), async_op=True).get_future().wait()
        raise ValueError("raised in a callback")

    fut = dist.all_reduce(torch.ones(4), async_op=True).get_future().then(boom)
    try:
        fut.wait()
        raise SystemExit("a raising callback's future succeeded")
    except RuntimeError as e:  # torch's then() wraps it: "Got the following error when running the callback"
        assert "raised in a callback" in str(e), str(e)
    t = torch.ones(5)
    dist.all_reduce(t)  # the group goes on
    assert torch.equal(t, torch.full((5,), float(n))), t
    # A failed op: its Future raises the library's class, inside a callback too.
    seen = []

    def record(f):
        try:
            f.wait()
        except gradcomm.MismatchError as e:
            seen.append(e)
        return 0

    work = dist.all_reduce(torch.ones(100 + (r == 1)), async_op=True)
    follow = work.get_future().then(record)
    try:
        work.get_future().wait()
        raise SystemExit("a mismatched all_reduce succeeded")
    except gradcomm.MismatchError as e:
        assert "100" in str(e) and "101" in str(e), str(e)
    follow.wait()
    assert len(seen) == 1, seen
elif kind == "powersgd":
    gloo = dist.new_group(backend="gloo")

    def train(group):
        torch.manual_seed(1)
        model = nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 4))
        ddp = DDP(model, process_group=group)  # one bucket (see above)
        state = powerSGD.PowerSGDState(process_group=group, matrix_approximation_rank=2, start_powerSGD_iter=2,
                                       min_compression_rate=1, random_seed=0)
        ddp.register_comm_hook(state, powerSGD.powerSGD_hook)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
        data = torch.Generator().manual_seed(100 + r)
        for _ in range(8):
            x = torch.randn(16, 32, generator=data)
            opt.zero_grad()
            nn.functional.mse_loss(ddp(x), x[:, :4]).backward()
            opt.step()
        return torch.cat([p.detach().reshape(-1) for p in model.parameters()])

    mine = train(dist.group.WORLD)
    reference = train(gloo)
    assert torch.allclose(mine, reference, rtol=1e-4, atol=1e-6), \
        f"powerSGD on gradcomm differs from gloo by {(mine - reference).abs().max().item()}"
    digest = hashlib.sha256(mine.numpy().tobytes()).hexdigest()
    store.set(f"powersgd/{r}", digest)
    for q in range(n):
        store.wait([f"powersgd/{q}"], datetime.timedelta(seconds=30))
        assert store.get(f"powersgd/{q}").decode() == digest, f"rank {q}'s parameters differ from rank {r}'s"
    store.set(f"powersgd/read/{r}", "1")
    if r == 0:  # its process serves the store: stay until every rank has read it
        store.wait([f"powersgd/read/{q}" for q in range(n)], datetime.timedelta(seconds=30))
elif kind == "shutdown":
    seen = []

    def blocked(f):
        try:  # rank 1 never issues this one
            dist.all_reduce(torch.ones(6), async_op=True).get_future().wait()
        except RuntimeError as e:
            seen.append(e)
        return 0

    fut = dist.all_reduce(torch.ones(4), async_op=True).get_future().then(blocked if r == 0 else (lambda f: 0))
    if r == 0:
        time.sleep(0.5)  # let the callback block
        assert not fut.done()
        destroy_start = time.monotonic()
        dist.destroy_process_group()
        fut.wait()
        assert len(seen) == 1 and isinstance(seen[0], gradcomm.Error), seen
        assert time.monotonic() - destroy_start < 10, time.monotonic() - destroy_start
        store.set("shutdown/destroyed", "1")
        store.wait(["shutdown/seen"], datetime.timedelta(seconds=30))  # rank 0 serves the store
    else:
        fut.wait()
        store.wait(["shutdown/destroyed"], datetime.timedelta(seconds=30))
        store.set("shutdown/seen", "1")
else:
    raise SystemExit(f"unknown kind {kind}")
print(f"OK torch-backend-callbacks rank={r} ({time.monotonic() - start:.2f} s)", flush=True)
os._exit(0)  # the mismatch and shutdown cases leave a broken group behind
