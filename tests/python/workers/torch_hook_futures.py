"""Rank program: the futures of gradcomm's DDP hook (compression_hook, over gloo).
First, a callback on a hook's future that runs the hook again and waits on it
returns (the future of the inner call must not complete on a thread that the
callback blocks), at once, with the exact average. Then an error in the hook keeps
its class: rank 0 compresses, the others do not, and DDP's backward() raises
gradcomm.MismatchError on every rank (it was "RuntimeError: Unable to cast ...": the
hook's Future carried the exception as its value), as does a wait on the hook's own
Future. Prints 'OK torch-hook-futures rank=R'."""
import datetime
import faulthandler
import os

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
