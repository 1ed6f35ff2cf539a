"""Rank program: failures on the "gradcomm" backend surface as errors, never hangs.
argv[1]:
  mismatch   rank 1 all_reduces one element more than the others: every rank's
             wait raises gradcomm.MismatchError naming both sizes
  peer_exit  the last rank exits without a word after a barrier: the others'
             all_reduce (and its future) fail with gradcomm.PeerFailure within 60 s
  slow_peer  Work.wait(timeout) on a call a late peer has not joined yet raises,
             naming the op; the call still completes when the peer comes
  destroy_pending  rank 0 destroys the group with a call outstanding: the call fails
             at once, and the peer's next call fails too (gradcomm errors)
  ddp_mismatch  DDP without a hook, rank 0's group compressing and the others' not:
             loss.backward() raises gradcomm.MismatchError on every rank
Prints 'OK torch-backend-<kind> rank=R'."""
import datetime
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import gradcomm
import gradcomm.torch  # noqa: F401  (registers the backend)

kind = sys.argv[1]
dist.init_process_group("gradcomm", timeout=datetime.timedelta(seconds=60))
r, n = dist.get_rank(), dist.get_world_size()
store = dist.distributed_c10d._get_default_store()  # ordering between ranks, not sleeps
dist.all_reduce(torch.ones(4))  # a good call first
if kind == "mismatch":
    t = torch.ones(100 + (r == 1))
    work = dist.all_reduce(t, async_op=True)
    future = work.get_future()
    try:
        work.wait()
        raise SystemExit("a mismatched all_reduce succeeded")
    except gradcomm.MismatchError as e:
        text = str(e)
        assert "100" in text and "101" in text, text
    assert work.is_completed() and not work.is_success()
    try:
        future.wait()
        raise SystemExit("the future of a mismatched all_reduce succeeded")
    except gradcomm.MismatchError as e:
        assert "101" in str(e), str(e)
    # The group is unusable afterwards; later calls say so instead of hanging.
    try:
        dist.all_reduce(torch.ones(3))
        raise SystemExit("an all_reduce after a mismatch succeeded")
    except gradcomm.Error as e:
        assert "unusable" in str(e), str(e)
elif kind == "peer_exit":
    dist.barrier()
    if r == n - 1:
        print(f"OK torch-backend-{kind} rank={r}", flush=True)
        os._exit(0)  # gone without a word
    start = time.monotonic()
    work = dist.all_reduce(torch.ones(1000), async_op=True)
    try:
        work.get_future().wait()
        raise SystemExit("an all_reduce with a dead peer succeeded")
    except gradcomm.PeerFailure:
        elapsed = time.monotonic() - start
        assert elapsed < 60, elapsed
    try:
        work.wait()
        raise SystemExit("wait() on the failed work succeeded")
    except gradcomm.PeerFailure:
        pass
elif kind == "slow_peer":
    # Work.wait(timeout) gives up with an error naming the op while the peer is
    # late; the work goes on and completes once the peer arrives.
    if r == 0:
        t = torch.full((10,), 1.0)
        work = dist.all_reduce(t, async_op=True)
        try:
            work.wait(datetime.timedelta(milliseconds=300))
            raise SystemExit("wait(300 ms) returned while the peer was still asleep")
        except RuntimeError as e:
            assert "allreduce" in str(e) and "300 ms" in str(e), str(e)
        assert not work.is_completed()
        store.set("slow_peer/timed_out", "1")  # only now may the peer join
        assert work.wait()
        assert torch.equal(t, torch.full((10,), float(n))), t
    else:
        # Told, not timed: a sleep here let a loaded machine reorder the two ranks.
        store.wait(["slow_peer/timed_out"], datetime.timedelta(seconds=60))
        t = torch.full((10,), 1.0)
        dist.all_reduce(t)
        assert torch.equal(t, torch.full((10,), float(n))), t
elif kind == "destroy_pending":
    # Destroying the group while a call is outstanding fails that call at once
    # (no hang, no crash), and the peer that never issued it learns of it.
    if r == 0:
        work = dist.all_reduce(torch.ones(1000), async_op=True)
        future = work.get_future()
        start = time.monotonic()
        dist.destroy_process_group()
        store.set("destroy_pending/destroyed", "1")
        try:
            work.wait()
            raise SystemExit("the outstanding work succeeded after destroy_process_group")
        except gradcomm.Error as e:
            assert "destroyed" in str(e), str(e)
        try:
            future.wait()
            raise SystemExit("the outstanding future succeeded after destroy_process_group")
        except gradcomm.Error as e:
            assert "destroyed" in str(e), str(e)
        assert time.monotonic() - start < 30
        # The store lives in this process: stay until the peer has read its key.
        store.wait(["destroy_pending/seen"], datetime.timedelta(seconds=60))
    else:
        # Issued only once rank 0 has destroyed its group; a sleep let a loaded
        # machine pair this call with rank 0's instead.
        store.wait(["destroy_pending/destroyed"], datetime.timedelta(seconds=60))
        store.set("destroy_pending/seen", "1")
        try:
            dist.all_reduce(torch.ones(5))
            raise SystemExit("an all_reduce with a destroyed peer group succeeded")
        except gradcomm.Error:
            pass
elif kind == "ddp_mismatch":
    # The error of a DDP bucket reaches backward() through the bucket's Future.
    gradcomm.torch.set_compression(None, "topk:ratio=0.1" if r == 0 else "none", min_compress_numel=0)
    torch.manual_seed(0)
    model = DDP(nn.Linear(64, 64))
    try:
        model(torch.randn(8, 64)).sum().backward()
        raise SystemExit("backward() with mismatched compression succeeded")
    except gradcomm.MismatchError as e:
        assert "topk" in str(e), str(e)
else:
    raise SystemExit(f"unknown kind {kind}")
print(f"OK torch-backend-{kind} rank={r}", flush=True)
os._exit(0)  # the peers are gone or the group is broken: skip the orderly teardown
