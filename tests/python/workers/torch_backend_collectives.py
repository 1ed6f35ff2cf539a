"""Rank program: torch.distributed collectives on the "gradcomm" backend, checked
against numpy references computed from every rank's closed-form input (rank q
contributes value(q, i), so each rank knows all inputs). A faithful subset of
torch's own distributed collective tests: shapes (empty, one element, odd sizes,
2-D, non-contiguous), dtypes, in-place semantics, async works and futures, all
reduce ops, and the errors for unsupported ops and dtypes.
Prints 'OK torch-backend rank=R' when all hold."""
import datetime
import os

import nodes  # noqa: F401  (first: GRADCOMM_NODE, when the test asks for nodes)

import numpy as np
import torch
import torch.distributed as dist

import gradcomm
import gradcomm.torch as gtorch

dist.init_process_group("gradcomm", timeout=datetime.timedelta(seconds=60))
r, n = dist.get_rank(), dist.get_world_size()
pg = dist.group.WORLD
# torch 1.13: the group is gradcomm's; torch >= 2: torch's ProcessGroup dispatching to it.
assert isinstance(gtorch.backend(pg), gtorch._gradcomm_torch.ProcessGroupGradcomm)
assert dist.get_backend() == "gradcomm", dist.get_backend()
assert gtorch.backend(pg).compression == "none"

SHAPES = [(0,), (1,), (7,), (1023,), (3, 5), (2, 0, 3)]
REDUCE_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64, torch.uint8]
OPS = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG, "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}


def value(q, shape, dtype):
    """Rank q's input as a float64 numpy array: small integers (exact in every dtype),
    signed unless the dtype is unsigned, different on every rank."""
    count = int(np.prod(shape))
    i = np.arange(count, dtype=np.int64)
    if dtype == torch.uint8:
        v = (i * 7 + q * 13) % 60
    else:
        v = ((i * 7 + q * 13) % 41) - 20
    return v.astype(np.float64).reshape(shape)


def any_value(q, shape, dtype):
    """value(), also for dtypes the library only moves as bytes (bool: 0/1)."""
    return value(q, shape, torch.uint8) % 2 if dtype == torch.bool else value(q, shape, dtype)


def as_torch(a, dtype):
    return torch.from_numpy(a).to(dtype)


def reference(op, shape, dtype):
    stack = np.stack([value(q, shape, dtype) for q in range(n)])
    if op == "sum":
        return stack.sum(0)
    if op == "min":
        return stack.min(0)
    if op == "max":
        return stack.max(0)
    s = stack.sum(0)  # avg: integers truncate toward zero, like C's division
    return np.trunc(s / n) if not dtype.is_floating_point else s / n


def check(got, want, dtype, what):
    got = got.to(torch.float64).numpy()
    tol = {torch.float16: 1e-2, torch.bfloat16: 2e-2}.get(dtype, 1e-6)
    assert got.shape == want.shape, f"{what}: shape {got.shape} vs {want.shape}"
    assert np.allclose(got, want, rtol=tol, atol=tol), f"{what}: got {got.ravel()[:8]} want {want.ravel()[:8]}"


# ---- all_reduce: every op, dtype and shape; in place --------------------------------------
for dtype in REDUCE_DTYPES:
    for shape in SHAPES:
        for name, op in OPS.items():
            t = as_torch(value(r, shape, dtype), dtype)
            ptr = t.data_ptr()
            assert dist.all_reduce(t, op=op) is None
            assert t.data_ptr() == ptr and t.dtype == dtype and tuple(t.shape) == shape
            check(t, reference(name, shape, dtype), dtype, f"all_reduce {name} {dtype} {shape}")

# Non-contiguous input: the result lands in the caller's strided tensor.
base = as_torch(value(r, (5, 3), torch.float32), torch.float32)
t = base.t()
assert not t.is_contiguous()
dist.all_reduce(t)
check(base, reference("sum", (5, 3), torch.float32), torch.float32, "all_reduce non-contiguous")

# Complex: torch hands SUM over as the real view (float32 pairs).
t = torch.complex(as_torch(value(r, (6,), torch.float32), torch.float32), torch.full((6,), float(r)))
dist.all_reduce(t)
check(t.real, reference("sum", (6,), torch.float32), torch.float32, "all_reduce complex (real part)")
check(t.imag, reference("sum", (6,), torch.float32) * 0 + sum(range(n)), torch.float32, "all_reduce complex (imag)")

# all_reduce_coalesced: several tensors (one strided), each reduced in place.
parts = [as_torch(value(r, shape, torch.float32), torch.float32) for shape in [(5,), (4, 3), (0,)]]
parts[1] = parts[1].t()
dist.all_reduce_coalesced(parts, op=dist.ReduceOp.MAX)
for t, shape in zip(parts, [(5,), (4, 3), (0,)]):
    want = reference("max", shape, torch.float32)
    check(t.t() if t.dim() == 2 else t, want, torch.float32, f"all_reduce_coalesced {shape}")

# ---- async: Work.wait, is_completed, is_success, get_future ---------------------------------
works = []
for k in range(4):
    t = as_torch(value(r, (257,), torch.float32), torch.float32) * (k + 1)
    works.append((k, t, dist.all_reduce(t, async_op=True)))
futures = [(k, t, w.get_future()) for k, t, w in works]
for k, t, w in works:
    assert w.wait() is True
    assert w.is_completed() and w.is_success()
for k, t, f in futures:
    result = f.wait()
    assert isinstance(result, list) and len(result) == 1, result
    assert result[0].data_ptr() == t.data_ptr(), "the future's value is the reduced tensor itself"
    check(t, reference("sum", (257,), torch.float32) * (k + 1), torch.float32, f"async all_reduce {k}")
# A callback chained on the future runs with the result.
t = as_torch(value(r, (9,), torch.float64), torch.float64)
chained = dist.all_reduce(t, async_op=True).get_future().then(lambda fut: fut.value()[0] * 2)
check(chained.wait(), reference("sum", (9,), torch.float64) * 2, torch.float64, "future.then")
# wait(timeout) on a completed work returns True.
w = dist.all_reduce(torch.ones(3), async_op=True)
w.wait()
assert w.wait(datetime.timedelta(seconds=5))

# ---- broadcast: each root, dtypes the library adds and byte-moved ones ----------------------
for root in range(n):
    for dtype in REDUCE_DTYPES + [torch.bool, torch.int8, torch.int16, torch.complex64]:
        for shape in [(0,), (1,), (11,), (4, 3)]:
            src, mine = any_value(root, shape, dtype), any_value(r, shape, dtype)
            t = as_torch(mine, dtype)
            ptr = t.data_ptr()
            dist.broadcast(t, src=root)
            assert t.data_ptr() == ptr
            assert torch.equal(t, as_torch(src, dtype)), f"broadcast root {root} {dtype} {shape}: {t}"

# ---- all_gather and all_gather_into_tensor ------------------------------------------------
for dtype in [torch.float32, torch.int64, torch.float16, torch.bool]:
    for shape in [(0,), (1,), (13,), (2, 3)]:
        mine = any_value(r, shape, dtype)
        outs = [torch.full(shape, 99).to(dtype) for _ in range(n)]
        dist.all_gather(outs, as_torch(mine, dtype))
        for q in range(n):
            want = as_torch(any_value(q, shape, dtype), dtype)
            assert torch.equal(outs[q], want), f"all_gather {dtype} {shape} from {q}"
        flat = torch.empty((n * int(np.prod(shape)),), dtype=dtype)
        dist.all_gather_into_tensor(flat, as_torch(mine, dtype))
        assert torch.equal(flat, torch.cat([outs[q].reshape(-1) for q in range(n)])), f"all_gather_into_tensor {dtype}"
# DDP's shape check gathers int64 metadata this way.
sizes = [torch.zeros(3, dtype=torch.int64) for _ in range(n)]
dist.all_gather(sizes, torch.tensor([r, 2 * r, 7], dtype=torch.int64))
assert [s.tolist() for s in sizes] == [[q, 2 * q, 7] for q in range(n)]

# ---- reduce_scatter and reduce_scatter_tensor: every op ------------------------------------
for dtype in [torch.float32, torch.int32, torch.float64]:
    for m in [0, 1, 5]:
        for name, op in OPS.items():
            full = [value(q, (n, m), dtype) for q in range(n)]  # rank q's n chunks of m
            inputs = [as_torch(full[r][i].copy(), dtype) for i in range(n)]
            keep = [x.clone() for x in inputs]
            out = torch.full((m,), 99).to(dtype)
            dist.reduce_scatter(out, inputs, op=op)
            stack = np.stack([f[r] for f in full])
            want = {"sum": stack.sum(0), "min": stack.min(0), "max": stack.max(0)}.get(name)
            if want is None:
                want = stack.sum(0) / n if dtype.is_floating_point else np.trunc(stack.sum(0) / n)
            check(out, want, dtype, f"reduce_scatter {name} {dtype} m={m}")
            assert all(torch.equal(a, b) for a, b in zip(inputs, keep)), "reduce_scatter changed its inputs"
            flat_in = as_torch(full[r].reshape(-1).copy(), dtype)
            before = flat_in.clone()
            out2 = torch.empty((m,), dtype=dtype)
            dist.reduce_scatter_tensor(out2, flat_in, op=op)
            check(out2, want, dtype, f"reduce_scatter_tensor {name} {dtype} m={m}")
            assert torch.equal(flat_in, before), "reduce_scatter_tensor changed its input"

# The exact reduce-scatter is the library's: it sends (N-1)/N of its input (the ring's
# reduce-scatter phase), half of what an allreduce of the input would.
m = 262144
big = torch.full((n * m,), float(r + 1))
st0 = gtorch.stats()
out_big = torch.empty(m)
dist.reduce_scatter_tensor(out_big, big)
st1 = gtorch.stats()
sent = st1["bytes_sent"] - st0["bytes_sent"]
assert torch.equal(out_big, torch.full((m,), float(n * (n + 1) // 2)))
if st1["node_shm_ops"] > st0["node_shm_ops"]:
    # Inside a node on its shared segment (docs/shared-memory.md): nothing on the wire there. With
    # nodes of L ranks (workers/nodes.py), the level across sends (nodes-1)/nodes of each rank's
    # share after the node's reduce-scatter, n*m/L elements.
    per_node = int(os.environ.get("GRADCOMM_TEST_RANKS_PER_NODE") or n)
    nodes_count = n // per_node
    across = (nodes_count - 1) * (n * m // per_node) * 4 // nodes_count
    assert across <= sent <= across * 1.02 + 16384, \
        f"reduce_scatter_tensor on the shared segment sent {sent} bytes, expected {across}"
else:
    assert (n - 1) * m * 4 <= sent <= (n - 1) * m * 4 * 1.02 + 16384, f"reduce_scatter_tensor sent {sent} bytes"

# ---- barrier, and a subgroup on the same backend -------------------------------------------
dist.barrier()
sub = dist.new_group(ranks=list(range(n)), backend="gradcomm",
                     pg_options=gtorch.ProcessGroupOptions(compression="none"))
t = torch.full((4,), float(r))
dist.all_reduce(t, group=sub)
assert torch.equal(t, torch.full((4,), float(sum(range(n)))))

# ---- compression settings -------------------------------------------------------------------
gtorch.set_compression(sub, "topk:ratio=0.5", min_compress_numel=2)
assert gtorch.backend(sub).compression == "topk:ratio=0.5" and gtorch.backend(sub).min_compress_numel == 2
try:
    gtorch.set_compression(sub, "topk:ratio=banana")
    raise SystemExit("a bad spec was accepted")
except gradcomm.InvalidArgument as e:  # also a ValueError
    assert isinstance(e, ValueError) and "ratio" in str(e), e
assert gtorch.backend(sub).compression == "topk:ratio=0.5"
# Integer tensors and MIN/MAX stay exact under a compressor.
t = as_torch(value(r, (50,), torch.int64), torch.int64)
dist.all_reduce(t, group=sub)
check(t, reference("sum", (50,), torch.int64), torch.int64, "int64 under compression")
t = as_torch(value(r, (50,), torch.float32), torch.float32)
dist.all_reduce(t, op=dist.ReduceOp.MAX, group=sub)
check(t, reference("max", (50,), torch.float32), torch.float32, "max under compression")
# A float32 sum is compressed: top-k keeps k of 64 per rank, so the result differs
# from the exact sum, yet is the same on every rank.
t = torch.arange(64, dtype=torch.float32) * (r + 1) - 30
dist.all_reduce(t, group=sub)
exact = sum((torch.arange(64, dtype=torch.float32) * (q + 1) - 30) for q in range(n))
assert not torch.equal(t, exact), "topk:ratio=0.5 gave the exact sum"
gathered = [torch.empty(64) for _ in range(n)]
dist.all_gather(gathered, t, group=sub)
assert all(torch.equal(g, gathered[0]) for g in gathered), "compressed results differ across ranks"
# Small tensors (metrics, counters) stay exact by default, whatever the compressor.
gtorch.set_compression(sub, "topk:ratio=0.01")
assert gtorch.backend(sub).min_compress_numel == 1024, gtorch.backend(sub).min_compress_numel
t = as_torch(value(r, (1000,), torch.float32), torch.float32)
dist.all_reduce(t, group=sub)
check(t, reference("sum", (1000,), torch.float32), torch.float32, "a small tensor under top-k")
# Fresh tensors each call: each gets its own error-feedback state, dropped once the
# tensor is freed, so the state stays bounded (without the sweep: 300 residuals).
gtorch.set_compression(sub, "topk:ratio=0.01", min_compress_numel=0)
for step in range(300):
    dist.all_reduce(torch.full((4096,), float(r + step)), group=sub)
state = gtorch.backend(sub)._compression_state_bytes()
assert state < 150 * 4096 * 4, f"compression state grew to {state} bytes over 300 fresh tensors"
gtorch.set_compression(sub, "none")

# ---- errors: unsupported ops, dtypes and ops, bad arguments ---------------------------------
def expect_error(what, cls, fn, *needles):
    try:
        fn()
    except cls as e:
        text = str(e)
        for needle in needles:
            assert needle in text, f"{what}: '{needle}' not in: {text}"
        return
    raise SystemExit(f"{what}: no error")


x = torch.ones(4)
peers = [torch.ones(4) for _ in range(n)]
expect_error("reduce", NotImplementedError, lambda: dist.reduce(x, dst=0), "reduce", "supported: all_reduce")
expect_error("gather", NotImplementedError, lambda: dist.gather(x, peers if r == 0 else None, dst=0),
             "gather", "supported")
expect_error("scatter", NotImplementedError, lambda: dist.scatter(x, peers if r == 0 else None, src=0),
             "scatter", "supported")
expect_error("all_to_all_single", NotImplementedError,
             lambda: dist.all_to_all_single(torch.ones(2 * n), torch.ones(2 * n)), "alltoall")
expect_error("send", NotImplementedError, lambda: dist.send(x, dst=(r + 1) % n), "send")
expect_error("product", NotImplementedError, lambda: dist.all_reduce(x, op=dist.ReduceOp.PRODUCT),
             "allreduce", "SUM, AVG, MIN, MAX")
expect_error("bool allreduce", ValueError, lambda: dist.all_reduce(torch.ones(3, dtype=torch.bool)),
             "allreduce", "Bool")
expect_error("int8 allreduce", ValueError, lambda: dist.all_reduce(torch.ones(3, dtype=torch.int8)),
             "allreduce", "Char")
expect_error("sparse", ValueError, lambda: dist.all_reduce(torch.ones(3).to_sparse()), "allreduce", "Sparse")
expect_error("all_gather sizes", ValueError,
             lambda: dist.all_gather([torch.empty(3) for _ in range(n)], torch.ones(4)), "allgather", "elements")
expect_error("reduce_scatter_tensor sizes", ValueError,
             lambda: dist.reduce_scatter_tensor(torch.empty(3), torch.ones(3 * n + 1)),
             "reduce_scatter_tensor", "elements")
# None of those reached the wire: the group still works.
t = torch.full((3,), float(r + 1))
dist.all_reduce(t)
assert torch.equal(t, torch.full((3,), float(n * (n + 1) // 2)))

dist.barrier()
print(f"OK torch-backend rank={r}", flush=True)
dist.destroy_process_group()
