"""Rank program: ranks call different collectives; every rank must raise
gradcomm.MismatchError naming the disagreement. argv[1]: numel | compressor | op |
op_stopped (as op, with rank 2 stopped by SIGSTOP while ranks 0 and 1 find the
mismatch, raise and exit: when it resumes, the notice and their departure are both
waiting, and it must still raise MismatchError, not PeerFailure)."""
import os
import signal
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
    elif kind == "op_stopped":
        if r == 0:
            gradcomm.broadcast(x, root=0)
        elif r == 1:
            gradcomm.allreduce(x)
        else:
            work = gradcomm.allreduce_async(x)
            if os.fork() == 0:  # wakes the parent once ranks 0 and 1 are gone
                import time
                time.sleep(1.5)
                os.kill(os.getppid(), signal.SIGCONT)
                os._exit(0)
            os.kill(os.getpid(), signal.SIGSTOP)
            work.wait()
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
