"""Rank program: the futures of gradcomm's DDP hook (compression_hook, over gloo).
First, a callback on a hook's future that runs the hook again and waits on it
returns (the future of the inner call must not complete on a thread that the
callback blocks), at once, with the exact average. The callbacks of three hook
futures issued one after another run one after another, in issue order, never
overlapping, though each sleeps. A callback that waits on a later hook future
(issued after it, outside any callback) gets its exact average once the completer's
stall limit (5 s, OrderedCompleter::kStall) has passed, not before, and not never.
Then an error in the hook keeps its class: rank 0 compresses, the others do not, and
DDP's backward() raises gradcomm.MismatchError on every rank (it was "RuntimeError:
Unable to cast ...": the hook's Future carried the exception as its value), as does
a wait on the hook's own Future. Prints 'OK torch-hook-futures rank=R'."""
import datetime
import faulthandler
import os
import threading
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import gradcomm
from gradcomm.torch import CompressionHookState, compression_hook

faulthandler.dump_traceback_later(60, exit=True)
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
gradcomm.init()
r, n = gradcomm.rank(), gradcomm.size()


class Bucket:  # what compression_hook reads of DDP's GradBucket
    def __init__(self, tensor):
        self._tensor = tensor

    def buffer(self):
        return self._tensor

    def is_last(self):
        return True


state = CompressionHookState(compression="none")
outer = compression_hook(state, Bucket(torch.full((8,), float(r))))
chained = outer.then(lambda f: compression_hook(state, Bucket(torch.ones(3))).wait() + f.value().sum())
assert torch.equal(chained.wait(), torch.full((3,), 1.0 + 8 * sum(range(n)) / n)), chained.value()

# Top-level futures: each callback starts only once the previous one has returned.
spans = []


def timed(i):
    def callback(f):
        start = time.monotonic()
        time.sleep(0.2)
        spans.append((i, start, time.monotonic()))
        return f.value()
    return callback


callbacks = [compression_hook(state, Bucket(torch.full((4,), float(r + i)))).then(timed(i)) for i in range(3)]
for i, c in enumerate(callbacks):
    assert torch.equal(c.wait(), torch.full((4,), i + sum(range(n)) / n)), (i, c.value())
assert [i for i, _, _ in spans] == [0, 1, 2], spans
assert all(spans[i][2] <= spans[i + 1][1] for i in range(2)), spans

# A callback that waits on a later top-level future: that one is held behind the
# callback until the stall limit, then completed beside it.
later, issued = [], threading.Event()


def wait_on_later(f):
    if threading.current_thread() is threading.main_thread():
        return None  # `first` was done before then(): its callback ran here, nothing is held
    issued.wait()
    return later[0].wait()


start = time.monotonic()
first = compression_hook(state, Bucket(torch.zeros(2)))
blocked = first.then(wait_on_later)
later.append(compression_hook(state, Bucket(torch.full((2,), float(r)))))
issued.set()
if blocked.wait() is None:
    print(f"rank {r}: the stall case did not arise (the first future was done before then())", flush=True)
    assert torch.equal(later[0].wait(), torch.full((2,), sum(range(n)) / n)), later[0].value()
else:
    elapsed = time.monotonic() - start
    assert torch.equal(blocked.value(), torch.full((2,), sum(range(n)) / n)), blocked.value()
    assert 4.9 <= elapsed < 30, elapsed

torch.manual_seed(0)
model = DDP(nn.Linear(64, 64))
futures = []


def hook(state, bucket):
    futures.append(compression_hook(state, bucket))
    return futures[-1]


model.register_comm_hook(CompressionHookState(compression="topk:ratio=0.1" if r == 0 else "none", start_iter=0), hook)
try:
    model(torch.randn(8, 64)).sum().backward()
    raise SystemExit("backward() with mismatched compression succeeded")
except gradcomm.MismatchError as e:
    assert "topk" in str(e), str(e)
try:
    futures[0].wait()
    raise SystemExit("the hook's future succeeded")
except gradcomm.MismatchError:
    pass
print(f"OK torch-hook-futures rank={r}", flush=True)
os._exit(0)  # the communicator is broken: skip the orderly teardown
