"""Rank program (under gradcomm-run, one host): gradcomm.alloc_shared. numpy arrays over
the buffer are allreduced from the ranks' buffers in place (no byte through the node
segment's slots), exactly, whole and in part (the rest untouched); small calls take the
slots; arguments are checked; a rank that passes private memory where the others pass
the shared buffer gets MismatchError on every rank. Prints 'OK shared-buffers rank=R'."""
import faulthandler

import numpy as np

import gradcomm

faulthandler.dump_traceback_later(60, exit=True)
gradcomm.init()
r, n = gradcomm.rank(), gradcomm.size()
buf = gradcomm.alloc_shared(1 << 20)
assert buf.shared and len(buf) == 1 << 20
x = np.frombuffer(buf, dtype=np.float32)
assert x.flags.writeable and not x.any()  # zero-filled
i = np.arange(x.size)
x[:] = i % 50 + r
before = gradcomm.stats()
gradcomm.allreduce(x)
after = gradcomm.stats()
np.testing.assert_array_equal(x, n * (i % 50) + n * (n - 1) // 2)
assert after["node_shm_ops"] == before["node_shm_ops"] + 1, (before, after)
assert after["node_shm_bytes"] == before["node_shm_bytes"], "the shared buffers went through the slots"

x[:] = r + 1
part = x[1000:200_003]
gradcomm.allreduce(part)
np.testing.assert_array_equal(part, n * (n + 1) // 2)
np.testing.assert_array_equal(x[:1000], r + 1)
np.testing.assert_array_equal(x[200_003:], r + 1)

small = np.frombuffer(gradcomm.alloc_shared(4096), dtype=np.int32)
small[:] = r
before = gradcomm.stats()
gradcomm.allreduce(small)
assert gradcomm.stats()["node_shm_bytes"] > before["node_shm_bytes"]
np.testing.assert_array_equal(small, n * (n - 1) // 2)

for bad in (0, -1, 1.5, True):
    try:
        gradcomm.alloc_shared(bad)
        raise AssertionError(f"alloc_shared({bad!r}) passed")
    except gradcomm.InvalidArgument:
        pass

x[:] = 1
mine = x if r != n - 1 else np.ones_like(x)  # the last rank passes its own memory
try:
    gradcomm.allreduce(mine)
    raise AssertionError("a rank passing private memory went unnoticed")
except gradcomm.MismatchError as e:
    assert "allreduce" in str(e), e
print(f"OK shared-buffers rank={r}", flush=True)
