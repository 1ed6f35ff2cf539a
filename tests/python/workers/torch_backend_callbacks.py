"""Rank program: torch.futures callbacks on the "gradcomm" backend that issue
collectives and wait on them (the Future of an op must not complete on a thread that
such a callback blocks). argv[1]:
  chain     the chained callback of the issue (all_reduce(a).then(all_reduce(b).wait())),
            a three-deep chain, four chains one after another: exact sums; then four
            chains in flight at once: each exact (a callback's ops follow the op it is
            attached to, before the program's next op: issue_order.cc)
  threads   two threads issuing 100 all_reduces each at once, never waiting: refused on
            every rank, or exact where they happened not to overlap; never a sum of the
            two threads' numbers
  raise     a callback that raises: its error reaches the chained future's waiter, and
            the group goes on; a callback of a failed op (a mismatch) sees
            gradcomm.MismatchError
  powersgd  DDP with torch's own powerSGD_hook (rank 2, from step 2, 10 steps) on the
            gradcomm group, one bucket: every step's loss within 1e-4 of the same
            training on a gloo group, parameters identical on every rank and equal
            within fp32 reduction-order error
  hooks     DDP with several buckets (bucket_cap_mb tiny: one per parameter) and
            torch's powerSGD_hook, fp16_compress_hook and bf16_compress_hook (not
            batched_powerSGD_hook: torch's own fails on CPU, gloo too), one fixed batch per rank: 10 steps complete, replicas
            identical on every rank, the loss falling; fp16/bf16 within a few 16-bit ulps
            of the same hook on gloo (bf16 on torch 2.x: 1.13's needs CUDA) (gloo itself times out on the PowerSGD ones: their callbacks
            race the next buckets there)
  held      a callback waits on a later top-level op, which the issue order holds behind
            that callback: on a group with a 4 s timeout the held op fails on every rank
            within the timeout plus a few seconds, saying why, and the callback returns
  shutdown  a callback is blocked on a collective the peer never issues when rank 0
            destroys the group: the callback gets the error, and the destroy returns
Every wait runs under a watchdog (faulthandler): a hang ends within 60 s, with
every thread's stack. Prints 'OK torch-backend-callbacks rank=R'."""
import datetime
import faulthandler
import hashlib
import os
import sys
import threading
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
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


def same_everywhere(tag, t):
    """Asserts that `t` is bitwise the same on every rank (through the store)."""
    digest = hashlib.sha256(t.numpy().tobytes()).hexdigest()
    store.set(f"{tag}/{r}", digest)
    for q in range(n):
        store.wait([f"{tag}/{q}"], datetime.timedelta(seconds=30))
        assert store.get(f"{tag}/{q}").decode() == digest, f"{tag}: rank {q}'s parameters differ from rank {r}'s"
    store.set(f"{tag}/read/{r}", "1")
    if r == 0:  # its process serves the store: stay until every rank has read it
        store.wait([f"{tag}/read/{q}" for q in range(n)], datetime.timedelta(seconds=30))


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
    assert refused == 0, "a callback's op and the next top-level op were refused as concurrent issuers"
elif kind == "threads":
    results, errors = {}, []

    def issue(tid):
        try:
            works = [(dist.all_reduce(t, async_op=True), t) for t in
                     (torch.full((8,), float(1000 * tid + i)) for i in range(100))]
            results[tid] = []
            for w, t in works:
                w.wait()
                results[tid].append(t)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=issue, args=(tid,)) for tid in (1, 2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    for e in errors:
        assert "issued on thread" in str(e) or "earlier failure" in str(e), str(e)
    if not errors:  # no overlap on this rank, nor (else it would have been aborted) on any other
        for tid, ts in results.items():
            for i, t in enumerate(ts):
                assert torch.equal(t, torch.full((8,), float((1000 * tid + i) * n))), (tid, i, t)
    print(f"RESULT threads rank={r}: {'refused' if errors else 'exact'}", flush=True)
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
        ddp = DDP(model, process_group=group)  # one bucket
        state = powerSGD.PowerSGDState(process_group=group, matrix_approximation_rank=2, start_powerSGD_iter=2,
                                       min_compression_rate=1, random_seed=0)
        ddp.register_comm_hook(state, powerSGD.powerSGD_hook)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
        data = torch.Generator().manual_seed(100 + r)
        losses = []
        for _ in range(10):
            x = torch.randn(16, 32, generator=data)
            opt.zero_grad()
            loss = nn.functional.mse_loss(ddp(x), x[:, :4])
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return torch.cat([p.detach().reshape(-1) for p in model.parameters()]), losses

    mine, mine_losses = train(dist.group.WORLD)
    reference, reference_losses = train(gloo)
    worst = max(abs(a - b) for a, b in zip(mine_losses, reference_losses))
    assert worst <= 1e-4, f"powerSGD on gradcomm: loss differs from gloo's by {worst} ({mine_losses} vs {reference_losses})"
    assert torch.allclose(mine, reference, rtol=1e-4, atol=1e-6), \
        f"powerSGD on gradcomm differs from gloo by {(mine - reference).abs().max().item()}"
    same_everywhere("powersgd", mine)
    print(f"RESULT powersgd rank={r}: loss within {worst:.2g} of gloo's over 10 steps", flush=True)
elif kind == "hooks":
    # Not batched_powerSGD_hook: on CPU it raises AssertionError in torch's own
    # _orthogonalize (a 2-D matrix where it asserts a batch of them) at its first
    # compressed step, on gloo as here, in torch 1.13 and 2.15.
    hooks = {
        "powerSGD": (lambda: powerSGD.PowerSGDState(process_group=None, matrix_approximation_rank=2,
                                                    start_powerSGD_iter=2, min_compression_rate=1, random_seed=0),
                     powerSGD.powerSGD_hook),
        "fp16": (lambda: None, default_hooks.fp16_compress_hook),
        "bf16": (lambda: None, default_hooks.bf16_compress_hook),
    }
    if int(torch.__version__.split(".")[0]) < 2:
        del hooks["bf16"]  # torch 1.13's bf16 hook requires CUDA and NCCL (and its gloo has no bfloat16)
    gloo = dist.new_group(backend="gloo")

    def train(make_state, hook, group):
        torch.manual_seed(1)
        model = nn.Sequential(nn.Linear(32, 512), nn.Tanh(), nn.Linear(512, 512), nn.Tanh(), nn.Linear(512, 512),
                              nn.Tanh(), nn.Linear(512, 4))
        # Buckets of 4 KB from step 2 (torch 1.13 keeps its first at 1 MB: the model is 2 MB).
        ddp = DDP(model, process_group=group, bucket_cap_mb=0.004)
        state = make_state()
        if state is not None:
            state.process_group = group
        buckets = set()

        def counted(hook_state, bucket):
            buckets.add(bucket.index())
            return hook(hook_state, bucket)

        ddp.register_comm_hook(state if state is not None else group, counted)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
        x = torch.randn(16, 32, generator=torch.Generator().manual_seed(100 + r))
        losses = []
        for _ in range(10):
            opt.zero_grad()
            loss = nn.functional.mse_loss(ddp(x), x[:, :4])
            loss.backward()
            opt.step()
            losses.append(loss.item())
        assert len(buckets) >= 3, f"{len(buckets)} bucket(s); expected several"
        return torch.cat([p.detach().reshape(-1) for p in model.parameters()]), losses

    for name, (make_state, hook) in hooks.items():
        params, losses = train(make_state, hook, dist.group.WORLD)
        assert all(torch.isfinite(torch.tensor(losses))), (name, losses)
        assert losses[-1] < losses[0], (name, losses)
        same_everywhere(f"hooks/{name}", params)
        if name in ("fp16", "bf16"):
            reference, _ = train(make_state, hook, gloo)
            # The sums round to 16 bits in another order at N = 3: within a few of their ulps.
            tolerance = {"fp16": (1e-3, 1e-5), "bf16": (1e-2, 1e-4)}[name]
            assert torch.allclose(params, reference, rtol=tolerance[0], atol=tolerance[1]), \
                (name, (params - reference).abs().max().item())
        print(f"RESULT hooks {name} rank={r}: 10 steps, loss {losses[0]:.4f} -> {losses[-1]:.4f}", flush=True)
elif kind == "held":
    group = dist.new_group(list(range(n)), backend="gradcomm", timeout=datetime.timedelta(seconds=4))
    later, seen = [], []

    def waits_on_later(f):
        # On the caller's thread (then() runs a callback at once when the op is already
        # done), `later` could never come: the large op ahead keeps this from happening.
        assert threading.current_thread() is not threading.main_thread(), \
            "the op completed before its callback was attached"
        while not later:
            time.sleep(0.01)
        try:
            later[0].wait()
        except RuntimeError as e:
            seen.append(e)
        return 0

    begun = time.monotonic()
    # A large op ahead of the small one (tens of ms on a one-host segment), so that the
    # small one is still queued when its callback is attached: a small call alone may be
    # done first, and its callback would then run on this thread, where it waits forever.
    dist.all_reduce(torch.ones(32 << 20), group=group, async_op=True)
    fut = dist.all_reduce(torch.ones(2), group=group, async_op=True).get_future().then(waits_on_later)
    later.append(dist.all_reduce(torch.ones(3), group=group, async_op=True))  # held behind the callback
    fut.wait()
    took = time.monotonic() - begun
    assert len(seen) == 1 and "was held" in str(seen[0]) and "timeout" in str(seen[0]), seen
    assert took < 4 + 10, f"the held op failed after {took:.1f} s"
    print(f"RESULT held rank={r}: failed after {took:.1f} s: {str(seen[0])[:120]}", flush=True)
elif kind == "shutdown":
    seen, issued = [], threading.Event()

    def blocked(f):
        # Never on this (the main) thread: see "held".
        assert threading.current_thread() is not threading.main_thread(), \
            "the op completed before its callback was attached"
        try:  # rank 1 never issues this one
            work = dist.all_reduce(torch.ones(6), async_op=True)
            issued.set()
            work.get_future().wait()
        except RuntimeError as e:
            seen.append(e)
        return 0

    dist.all_reduce(torch.ones(32 << 20), async_op=True)  # ahead: still queued when the callback is attached
    fut = dist.all_reduce(torch.ones(4), async_op=True).get_future().then(blocked if r == 0 else (lambda f: 0))
    if r == 0:
        # The callback runs once the 128 MiB op is done (well over 0.5 s on a loaded
        # machine): the group is destroyed only after it has issued its op.
        assert issued.wait(30), "the callback never issued its op"
        time.sleep(0.2)  # let it block in the wait
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
# Rank 0's process serves the store: it stays until every rank is past its last use of it
# (a case that ends at once on rank 0, "threads" refused at issue, left rank 1 still in
# init_process_group's store barrier: "Connection reset by peer").
store.set(f"done/{r}", "1")
if r == 0:
    store.wait([f"done/{q}" for q in range(n)], datetime.timedelta(seconds=30))
print(f"OK torch-backend-callbacks rank={r} ({time.monotonic() - start:.2f} s)", flush=True)
os._exit(0)  # the mismatch and shutdown cases leave a broken group behind
