"""Rank program: ranks call different collectives; every rank must raise
gradcomm.MismatchError naming the disagreement. argv[1]: numel | compressor | op."""
import sys

import numpy as np

import gradcomm

kind = sys.argv[1]
gradcomm.init()
r = gradcomm.rank()
gradcomm.allreduce(np.ones(4, np.float32))  # a good call first: the mismatch is not at seq 1
x = np.ones(100, np.float32)
try:
    if kind == "numel":
        gradcomm.allreduce(np.ones(100 + (r == 1), np.float32))
    elif kind == "compressor":
        gradcomm.allreduce(x, compression="topk:ratio=0.1" if r == 0 else "none", name="x")
    elif kind == "op":
        if r == 0:
            gradcomm.broadcast(x, root=0)
        else:
            gradcomm.allreduce(x)
    else:
        raise SystemExit(f"unknown kind {kind}")
except gradcomm.MismatchError as e:
    text = str(e)
    assert "rank" in text, text
    if kind == "numel":
        assert "100" in text and "101" in text, text
    # The communicator is unusable afterwards; every later call says so.
    try:
        gradcomm.barrier()
        raise SystemExit("barrier after a mismatch succeeded")
    except gradcomm.MismatchError as later:
        assert "unusable" in str(later), str(later)
    print(f"OK mismatch-{kind} rank={r}", flush=True)
    gradcomm.shutdown()
    sys.exit(0)
raise SystemExit(f"rank {r}: no MismatchError for a {kind} mismatch")
