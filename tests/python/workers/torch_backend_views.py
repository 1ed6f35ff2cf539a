"""Rank program: error feedback on the "gradcomm" backend follows each view's own
layout. One 3x3 matrix W is all_reduced (SUM, top-k k=1 with error feedback) as W
and as its transpose W.t() in turn, then through a contiguous reshape (W.view(9): the
same elements in the same order as W, so it shares W's residual). Every result is
compared, exactly, with a numpy reference that keeps one residual per layout, in that
layout: acc = grad + residual; the largest |acc| is sent; residual = acc with it
zeroed; the result is the rank-ordered sum of what every rank sent.
Prints 'OK torch-backend-views rank=R'."""
import datetime
import faulthandler

import numpy as np
import torch
import torch.distributed as dist

import gradcomm.torch as gtorch

faulthandler.dump_traceback_later(60, exit=True)
SPEC = "topk:k=1,algo=allgather,values=fp32"
options = gtorch.ProcessGroupOptions(compression=SPEC, min_compress_numel=0)
dist.init_process_group("gradcomm", timeout=datetime.timedelta(seconds=60), pg_options=options)
r, n = dist.get_rank(), dist.get_world_size()


def gradient(rank, step):
    # Distinct magnitudes (no ties for top-k to break), different on every rank and step.
    return np.random.default_rng(100 * step + rank).uniform(-1, 1, (3, 3)).astype(np.float32)


# layout -> (how a gradient looks through it, the key its residual lives under)
LAYOUTS = {"W": (lambda g: g, "W"), "W.t()": (lambda g: g.T, "W.t()"), "W.view(9)": (lambda g: g.reshape(9), "W")}
residuals = {}  # (rank, key) -> flat residual in that key's layout
W = torch.zeros(3, 3)
for step, layout in enumerate(["W", "W.t()", "W", "W.t()", "W.t()", "W.view(9)", "W.t()", "W"]):
    view_of, key = LAYOUTS[layout]
    view = {"W": W, "W.t()": W.t(), "W.view(9)": W.view(9)}[layout]
    view.copy_(torch.from_numpy(np.ascontiguousarray(view_of(gradient(r, step)))))
    dist.all_reduce(view)

    expected = np.zeros(9, np.float32)
    for q in range(n):
        acc = np.ascontiguousarray(view_of(gradient(q, step))).reshape(9) + residuals.get((q, key), 0)
        top = int(np.argmax(np.abs(acc)))
        expected[top] += acc[top]
        acc[top] = 0
        residuals[(q, key)] = acc
    got = view.reshape(9).numpy()
    assert np.array_equal(got, expected), f"step {step} ({layout}): got {got}, expected {expected}"

print(f"OK torch-backend-views rank={r}", flush=True)
dist.destroy_process_group()
