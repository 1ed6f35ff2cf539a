"""Rank program: compressor="auto" through gradcomm's DDP hook measures the overlap DDP
really gives. The model is x -> A -> Sleep -> B, each layer one bucket, and Sleep's
backward sleeps SLEEP seconds: B's bucket is issued first and DDP needs it SLEEP later,
when backward ends with A's bucket, the last, which it needs at once. (The hook's own
thread waits on every call at once; that wait must not count.) After 12 iterations (the
first dense, then each key's reviews at its first call and 10 calls later) every rank's
gradcomm.stats() reports B's overlap at least 0.8 SLEEP and A's under 0.5 SLEEP, and the
parameters are bitwise identical on every rank. Prints 'OK torch-hook-overlap rank=R'."""
import datetime
import faulthandler
import hashlib
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import gradcomm
from gradcomm.torch import CompressionHookState, compression_hook

faulthandler.dump_traceback_later(120, exit=True)
SLEEP = 0.08 * max(1, int(os.environ.get("GRADCOMM_TEST_TIME_SCALE", "1")))
WIDTH = 600  # 360,000 weights a layer: more than DDP's 1 MiB first bucket, so one bucket each
torch.set_num_threads(1)
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
gradcomm.init()
r, n = gradcomm.rank(), gradcomm.size()


class Sleep(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        time.sleep(SLEEP)
        return grad


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(WIDTH, WIDTH, bias=False)
        self.b = nn.Linear(WIDTH, WIDTH, bias=False)

    def forward(self, x):
        return self.b(Sleep.apply(torch.tanh(self.a(x))))


torch.manual_seed(0)
model = Model()
ddp = DDP(model, bucket_cap_mb=1)
state = CompressionHookState(compression="auto")
ddp.register_comm_hook(state, compression_hook)
opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
data = torch.Generator().manual_seed(10 + r)
for _ in range(12):
    opt.zero_grad()
    ddp(torch.randn(8, WIDTH, generator=data)).square().mean().backward()
    opt.step()

choices = {c["key"]: c for c in gradcomm.stats()["auto_choices"]}
overlap = {key: choices[key]["overlap_s"] for key in state.keys}
assert len(state.keys) == 2, f"expected one bucket per layer, got keys {sorted(state.keys)}"
# The bucket keys name their parameters' ordinals in the order DDP first handed them to
# the hook: B's bucket (ready first in backward) is p0, A's p1.
first = next(k for k in state.keys if k.startswith("ddp/p0/"))
last = next(k for k in state.keys if k.startswith("ddp/p1/"))
assert overlap[first] >= 0.8 * SLEEP, f"bucket issued before the sleep: overlap {overlap[first]:.4f} s, slept {SLEEP} s"
assert overlap[last] < 0.5 * SLEEP, f"last bucket: overlap {overlap[last]:.4f} s, DDP needs it at once"

h = hashlib.sha256()
for p in model.parameters():
    h.update(p.detach().contiguous().numpy().tobytes())
digests = [None] * n
dist.all_gather_object(digests, h.hexdigest())
assert len(set(digests)) == 1, f"parameters differ across ranks: {digests}"
print(f"OK torch-hook-overlap rank={r} overlap first={overlap[first]:.4f} last={overlap[last]:.4f} "
      f"chosen={choices[first]['chosen']},{choices[last]['chosen']}", flush=True)
faulthandler.cancel_dump_traceback_later()
gradcomm.shutdown()
dist.destroy_process_group()
