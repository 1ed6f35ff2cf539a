"""Rank program (under gradcomm-run): numpy collectives against closed-form and
independently computed expectations. Prints 'OK numpy rank=R' when all hold."""
import os
import sys
import threading
import time

import numpy as np

import gradcomm

gradcomm.init()
r, n = gradcomm.rank(), gradcomm.size()
assert (r, n) == (int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])), (r, n)
assert gradcomm._init_source == "environment"
assert "torch" not in sys.modules  # numpy alone: no torch import behind the user's back

# ---- dense: rank r contributes r + i, so every result is known exactly -------------
rank_sum = n * (n - 1) // 2
for dtype in (np.float32, np.float64, np.int32, np.int64, np.float16):
    for numel in (0, 1, n - 1, 7, 1000, 100_003):
        x = (np.arange(numel) % 50 + r).astype(dtype)
        y = gradcomm.allreduce(x)
        assert y is x
        expect = (n * (np.arange(numel) % 50) + rank_sum).astype(dtype)
        np.testing.assert_array_equal(x, expect, err_msg=f"sum {dtype} numel={numel}")
x = np.full((3, 5), r + 1, np.uint8)
gradcomm.allreduce(x)
np.testing.assert_array_equal(x, np.full((3, 5), n * (n + 1) // 2, np.uint8))

x = (np.arange(64) + r).astype(np.float64)
gradcomm.allreduce(x, op="avg")
np.testing.assert_allclose(x, np.arange(64) + rank_sum / n, rtol=1e-15)
x = (np.arange(64) * (r + 1)).astype(np.int64)
gradcomm.allreduce(x, op="max")
np.testing.assert_array_equal(x, np.arange(64) * n)
x = (np.arange(64) - r).astype(np.float32)
gradcomm.allreduce(x, op="min")
np.testing.assert_array_equal(x, np.arange(64) - (n - 1))

# ---- allgather, reduce_scatter, broadcast, barrier ---------------------------------------
x = np.full((2, 3), r, np.int32)
out = gradcomm.allgather(x)
assert out.shape == (n, 2, 3)
for k in range(n):
    np.testing.assert_array_equal(out[k], np.full((2, 3), k, np.int32))
# reduce_scatter: (size(), ...) inputs give x.shape[1:]; flat inputs a flat share;
# the input stays unchanged; a wrong size is refused before anything is sent.
x = (np.arange(n * 12, dtype=np.int64).reshape(n, 3, 4) + 100 * r)
before = x.copy()
out = gradcomm.reduce_scatter(x)
assert out.shape == (3, 4) and out.dtype == np.int64, (out.shape, out.dtype)
np.testing.assert_array_equal(out, n * np.arange(r * 12, (r + 1) * 12).reshape(3, 4) + 100 * rank_sum)
np.testing.assert_array_equal(x, before)
x = (np.arange(n * 1001) % 97 + r).astype(np.float32)
out = gradcomm.reduce_scatter_async(x, op="max").wait()
np.testing.assert_array_equal(out, (np.arange(r * 1001, (r + 1) * 1001) % 97 + n - 1).astype(np.float32))
# Compressed (quant:bits=8, a payload per hop): close to the exact share, input unchanged.
x = np.random.default_rng(7 + r).standard_normal(n * 4096).astype(np.float32)
before = x.copy()
out = gradcomm.reduce_scatter(x, op="avg", compression="quant:bits=8", name="rs.q8")
exact = sum(np.random.default_rng(7 + q).standard_normal(n * 4096).astype(np.float64) for q in range(n)) / n
mine = exact[r * 4096:(r + 1) * 4096]
assert np.linalg.norm(out - mine) <= 0.05 * np.linalg.norm(mine), np.linalg.norm(out - mine) / np.linalg.norm(mine)
np.testing.assert_array_equal(x, before)
out = gradcomm.reduce_scatter(x, compression=f"topk:k={400 * n},ef=0,values=fp32", name="rs.topk")
# Each rank's top 400 N of its whole input, the entries in this rank's segment summed.
picks = []
for q in range(n):
    g = np.random.default_rng(7 + q).standard_normal(n * 4096).astype(np.float32)
    keep = np.zeros_like(g)
    top = np.argsort(-np.abs(g), kind="stable")[:400 * n]
    keep[top] = g[top]
    picks.append(keep)
np.testing.assert_allclose(out, sum(picks)[r * 4096:(r + 1) * 4096], rtol=1e-6, atol=1e-6)
np.testing.assert_array_equal(x, before)
try:
    gradcomm.reduce_scatter(x, compression="randomk:ratio=0.1", name="rs.randomk")
    raise AssertionError("reduce_scatter accepted random-k")
except ValueError as e:
    assert "not available for reduce_scatter" in str(e), e
try:
    gradcomm.reduce_scatter(np.zeros(n * 4 + 1, np.float32))
    raise AssertionError("an input of size() * m + 1 elements was accepted")
except ValueError as e:
    assert "not a multiple of size()" in str(e), e
x = np.arange(10, dtype=np.float64) * (r + 1)
root = n - 1
gradcomm.broadcast(x, root=root)
np.testing.assert_array_equal(x, np.arange(10, dtype=np.float64) * n)
gradcomm.barrier()

# ---- compressed: top-k against a numpy top-k of every rank's input --------------------
numel, k = 5000, 50
grads = [np.random.default_rng(100 + q).standard_normal(numel).astype(np.float32) for q in range(n)]
def bf16(a):
    """fp32 -> bf16 -> fp32, round to nearest even (the payload's values, base/half.h)."""
    bits = a.astype(np.float32).view(np.uint32).astype(np.uint64)
    bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    return bits.astype(np.uint32).view(np.float32)


def numpy_topk_avg(round_values):
    expect = np.zeros(numel, np.float64)
    for q in range(n):
        idx = np.argsort(-np.abs(grads[q]), kind="stable")[:k]
        expect[idx] += round_values(grads[q][idx])
    return expect / n


x = grads[r].copy()
gradcomm.allreduce(x, op="avg", compression=f"topk:k={k},values=fp32", name="w32")
np.testing.assert_allclose(x, numpy_topk_avg(lambda v: v), rtol=1e-6, atol=1e-7)
assert np.count_nonzero(x) <= n * k
x = grads[r].copy()  # the default: bf16 values, coded indices
gradcomm.allreduce(x, op="avg", compression=f"topk:k={k}", name="w")
np.testing.assert_allclose(x, numpy_topk_avg(bf16), rtol=1e-6, atol=1e-7)
assert np.count_nonzero(x) <= n * k
# Every rank holds bitwise the same result.
everyone = gradcomm.allgather(x)
for q in range(n):
    assert everyone[q].tobytes() == x.tobytes(), f"rank {q} differs"

# QSGD: bitwise identical on every rank, and an unbiased estimate close to the mean.
x = grads[r].copy()
gradcomm.allreduce(x, op="avg", compression="qsgd:levels=64", name="q")
everyone = gradcomm.allgather(x)
for q in range(n):
    assert everyone[q].tobytes() == x.tobytes(), f"qsgd: rank {q} differs"
mean = np.mean(grads, axis=0)
assert np.linalg.norm(x - mean) < 0.5 * np.linalg.norm(mean), np.linalg.norm(x - mean) / np.linalg.norm(mean)

# Compression puts fewer bytes on the wire than the dense ring.
big = np.random.default_rng(r).standard_normal(200_000).astype(np.float32)
st0 = gradcomm.stats()
gradcomm.allreduce(big.copy(), op="avg")
st1 = gradcomm.stats()
gradcomm.allreduce(big.copy(), op="avg", compression="topk:ratio=0.01", name="big")
st2 = gradcomm.stats()
dense, sparse = st1["bytes_sent"] - st0["bytes_sent"], st2["bytes_sent"] - st1["bytes_sent"]
if st1["node_shm_ops"] > st0["node_shm_ops"]:
    # Dense went through the node's shared segment (docs/shared-memory.md): only call headers on
    # the wire; compare with what the ring would send.
    assert dense < 4096, dense
    dense = 2 * (n - 1) * big.nbytes // n
assert sparse * 5 < dense, (dense, sparse)

# ---- state dict: restoring it replays the same compressed step ------------------------
saved = gradcomm.state_dict()
g = grads[r] * 0.5
a = gradcomm.allreduce(g.copy(), op="avg", compression=f"topk:k={k}", name="w")
gradcomm.load_state_dict(saved)
b = gradcomm.allreduce(g.copy(), op="avg", compression=f"topk:k={k}", name="w")
assert a.tobytes() == b.tobytes()

# ---- non-blocking: many calls in flight, waited in reverse; fused small calls -------
xs = [(np.arange(1 + 37 * j) % 11 + r).astype(np.float32) for j in range(30)]
works = [gradcomm.allreduce_async(x) for x in xs]
gathered = gradcomm.allgather_async(np.full(4, r, np.int64))
for j, work in reversed(list(enumerate(works))):
    assert work.wait() is xs[j]
    np.testing.assert_array_equal(xs[j], n * (np.arange(1 + 37 * j) % 11) + rank_sum, err_msg=f"async call {j}")
np.testing.assert_array_equal(gathered.wait()[:, 0], np.arange(n))
late = np.ones(10, np.float32)
if r == 1:
    time.sleep(0.3)
work = gradcomm.allreduce_async(late)
if r == 0:
    try:  # rank 1 is still asleep: the wait times out, the call goes on
        work.wait(timeout=0.01)
        raise SystemExit("wait(timeout=0.01) returned before rank 1 called")
    except gradcomm.Error:
        raise
    except TimeoutError:
        pass
assert work.wait() is late and late[0] == n

# ---- the GIL is released while a collective waits --------------------------------------
# Rank 0 waits ~0.5 s in allreduce for the late rank 1; a Python thread must keep running.
ticks, stop = 0, False


def spin():
    global ticks
    while not stop:
        ticks += 1
        time.sleep(0.001)


if r == 0:
    spinner = threading.Thread(target=spin)
    spinner.start()
    time.sleep(0.05)
else:
    time.sleep(0.5)
before = ticks
t0 = time.monotonic()
gradcomm.allreduce(np.ones(10, np.float32))
waited, during = time.monotonic() - t0, ticks - before
if r == 0:
    stop = True
    spinner.join()
    assert waited > 0.2 and during >= 20, (waited, during)

print(f"OK numpy rank={r} dense={dense} topk={sparse}", flush=True)
gradcomm.shutdown()
