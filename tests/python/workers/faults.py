"""Rank program: a peer that exits (PeerFailure) or is late (TimeoutError).
argv[1]: peer_exit | timeout."""
import builtins
import os
import sys
import time

import numpy as np

import gradcomm

kind = sys.argv[1]
if kind == "timeout":
    gradcomm.init(timeout=2)
else:
    gradcomm.init()
r = gradcomm.rank()
gradcomm.barrier()
x = np.ones(1000, np.float32)
if kind == "peer_exit":
    if r == 1:
        print(f"OK faults-{kind} rank={r}", flush=True)
        os._exit(0)  # gone without a word
    start = time.monotonic()
    try:
        gradcomm.allreduce(x)
        raise SystemExit("allreduce with a dead peer succeeded")
    except gradcomm.PeerFailure as e:
        assert isinstance(e, builtins.ConnectionError)
        elapsed = time.monotonic() - start
        assert elapsed < 60, elapsed
        print(f"OK faults-{kind} rank={r} after {elapsed:.1f}s: {e}", flush=True)
elif kind == "timeout":
    if r == 1:
        time.sleep(6)
    try:
        gradcomm.allreduce(x)
        raise SystemExit("allreduce with a late peer succeeded")
    except gradcomm.TimeoutError as e:
        # Rank 0 timed out itself; the late rank 1 raises rank 0's abort (its engine
        # received it while the caller slept), never a timeout of its own.
        assert r == 0 or "rank 0 reported" in str(e), f"rank {r} got TimeoutError itself: {e}"
        assert isinstance(e, builtins.TimeoutError)
        print(f"OK faults-{kind} rank={r}: {e}", flush=True)
    except gradcomm.Error as e:
        # The late rank learns of rank 0's timeout (its abort) or finds it gone.
        assert r == 1, f"rank 0 got {type(e).__name__}: {e}"
        print(f"OK faults-{kind} rank={r}: {type(e).__name__}: {e}", flush=True)
gradcomm.shutdown()
