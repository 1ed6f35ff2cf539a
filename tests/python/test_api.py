"""The Python API in one process (a world of one: the in-process transport, no
store): exception classes, input checks naming the problem, results, state."""
import builtins

import numpy as np
import pytest

import gradcomm
from gradcomm import _gradcomm


@pytest.fixture
def world_of_one():
    gradcomm.init(rank=0, world_size=1)
    yield
    gradcomm.shutdown()


# ---- exception classes ---------------------------------------------------------------

ERRORS = {
    "InvalidArgument": builtins.ValueError,
    "Unsupported": builtins.NotImplementedError,
    "TimeoutError": builtins.TimeoutError,
    "PeerFailure": builtins.ConnectionError,
    "MismatchError": None,
    "CorruptPayload": builtins.ValueError,
    "TransportError": None,
    "CudaError": None,
}


def test_error_classes_subclass_error_and_a_builtin():
    assert issubclass(gradcomm.Error, builtins.RuntimeError)
    for name, builtin in ERRORS.items():
        cls = getattr(gradcomm, name)
        assert cls.__module__ == "gradcomm" and cls.__name__ == name
        assert issubclass(cls, gradcomm.Error), name
        if builtin is not None:
            assert issubclass(cls, builtin), name
    # gradcomm.TimeoutError is ours, not the builtin (which it also is).
    assert gradcomm.TimeoutError is not builtins.TimeoutError
    e = gradcomm.TimeoutError("waited too long")
    assert str(e) == "waited too long"


def test_calls_before_init_raise_error():
    assert not gradcomm.is_initialized()
    for call in (gradcomm.rank, gradcomm.size, gradcomm.barrier, gradcomm.state_dict):
        with pytest.raises(gradcomm.Error, match="not initialized"):
            call()
    with pytest.raises(gradcomm.Error, match="not initialized"):
        gradcomm.allreduce(np.zeros(3, np.float32))


def test_init_without_rank_anywhere_is_invalid_argument(monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE",
                "SLURM_PROCID", "SLURM_NTASKS"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(gradcomm.InvalidArgument, match="rank and world size unknown"):
        gradcomm.init()
    with pytest.raises(ValueError, match="out of range"):
        gradcomm.init(rank=3, world_size=2)
    with pytest.raises(ValueError, match="timeout"):
        gradcomm.init(rank=0, world_size=1, timeout=-1)
    with pytest.raises(TypeError, match="store"):
        gradcomm.init(rank=0, world_size=2, store=42)
    assert not gradcomm.is_initialized()


def test_init_twice_is_a_no_op_and_shutdown_allows_init_again():
    gradcomm.init(rank=0, world_size=1)
    gradcomm.init(rank=0, world_size=1)
    assert gradcomm.rank() == 0 and gradcomm.size() == 1
    gradcomm.shutdown()
    gradcomm.shutdown()
    assert not gradcomm.is_initialized()
    gradcomm.init(rank=0, world_size=1)
    assert gradcomm.size() == 1
    gradcomm.shutdown()


# ---- results in a world of one ---------------------------------------------------------

def test_allreduce_is_in_place_and_returns_its_argument(world_of_one):
    for dtype in (np.float32, np.float64, np.float16, np.int32, np.int64, np.uint8):
        x = np.arange(12, dtype=dtype).reshape(3, 4)
        y = gradcomm.allreduce(x)
        assert y is x
        np.testing.assert_array_equal(x, np.arange(12, dtype=dtype).reshape(3, 4))
    x = np.linspace(-1, 1, 50, dtype=np.float32)
    before = x.copy()
    gradcomm.allreduce(x, op="avg")
    np.testing.assert_array_equal(x, before)


def test_allgather_shape_and_out(world_of_one):
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    out = gradcomm.allgather(x)
    assert out.shape == (1, 2, 3) and out.dtype == np.float32
    np.testing.assert_array_equal(out[0], x)
    given = np.zeros(6, np.float32)
    assert gradcomm.allgather(x, out=given) is given
    np.testing.assert_array_equal(given, x.ravel())


def test_torch_tensors_in_place(world_of_one):
    torch = pytest.importorskip("torch")
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64):
        t = torch.arange(10).to(dtype)
        assert gradcomm.allreduce(t) is t
        assert torch.equal(t, torch.arange(10).to(dtype))
    t = torch.arange(5, dtype=torch.float32)
    gathered = gradcomm.allgather(t)
    assert isinstance(gathered, torch.Tensor) and gathered.shape == (1, 5)
    assert torch.equal(gathered[0], t)
    # A view that is itself contiguous (offset into its storage) is fine.
    base = torch.zeros(10)
    gradcomm.broadcast(base[2:6], root=0)


def test_async_calls_return_work_whose_wait_returns_the_result(world_of_one):
    x = np.arange(8, dtype=np.float32)
    work = gradcomm.allreduce_async(x, op="avg")
    assert isinstance(work, gradcomm.Work)
    assert work.wait() is x
    assert work.is_completed()
    assert work.wait(timeout=0) is x  # done: returns at once, again
    needed = gradcomm.allreduce_async(x)
    needed.needed()  # never blocks; again after completion is harmless
    assert needed.wait() is x
    needed.needed()
    gathered = gradcomm.allgather_async(x).wait()
    assert gathered.shape == (1, 8)
    y = np.ones(3, np.int64)
    assert gradcomm.broadcast_async(y, root=0).wait() is y
    with pytest.raises(ValueError, match="timeout"):
        gradcomm.allreduce_async(x).wait(timeout=-1)
    with pytest.raises(ValueError, match="not contiguous"):
        gradcomm.allreduce_async(np.zeros((4, 4), np.float32)[:, ::2])
    assert gradcomm.local_rank() == 0
    assert "fused_calls" in gradcomm.stats()
    assert gradcomm.stats()["engine_cpu_s"] > 0  # it ran the collectives above


def test_forked_child_exits_without_touching_the_parents_communicator(world_of_one):
    import os
    pid = os.fork()
    if pid == 0:  # the child: no engine thread here; exiting normally runs shutdown()
        code = 0 if not gradcomm.is_initialized() else 1
        gradcomm.shutdown()
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    x = np.ones(3, np.float32)
    assert gradcomm.allreduce(x) is x  # the parent's communicator still works


# ---- wrong inputs ------------------------------------------------------------------------

def test_non_contiguous_is_value_error_naming_it(world_of_one):
    x = np.zeros((4, 4), np.float32)[:, ::2]
    with pytest.raises(ValueError, match=r"allreduce: tensor is not contiguous"):
        gradcomm.allreduce(x)
    torch = pytest.importorskip("torch")
    with pytest.raises(ValueError, match=r"not contiguous"):
        gradcomm.allreduce(torch.zeros(4, 4).t())


def test_read_only_is_value_error(world_of_one):
    x = np.zeros(4, np.float32)
    x.setflags(write=False)
    with pytest.raises(ValueError, match="read-only"):
        gradcomm.allreduce(x)
    gradcomm.allgather(x)  # the input of allgather is only read


def test_unsupported_types_are_type_error(world_of_one):
    with pytest.raises(TypeError, match="numpy.ndarray or a torch.Tensor, got builtins.list"):
        gradcomm.allreduce([1.0, 2.0])
    with pytest.raises(TypeError, match="complex64"):
        gradcomm.allreduce(np.zeros(3, np.complex64))
    with pytest.raises(TypeError, match="byte order"):
        gradcomm.allreduce(np.zeros(3, ">f4"))
    with pytest.raises(TypeError, match="op must be a str"):
        gradcomm.allreduce(np.zeros(3, np.float32), op=1)
    torch = pytest.importorskip("torch")
    with pytest.raises(TypeError, match="torch.bool"):
        gradcomm.allreduce(torch.zeros(3, dtype=torch.bool))
    with pytest.raises(TypeError, match="layout"):
        gradcomm.allreduce(torch.zeros(3, 3).to_sparse())
    with pytest.raises(TypeError, match="out is float64"):
        gradcomm.allgather(np.zeros(3, np.float32), out=np.zeros(3, np.float64))


def test_bad_arguments_are_invalid_argument(world_of_one):
    x = np.ones(8, np.float32)
    with pytest.raises(gradcomm.InvalidArgument, match="op 'median'"):
        gradcomm.allreduce(x, op="median")
    with pytest.raises(gradcomm.InvalidArgument, match="nosuch"):
        gradcomm.allreduce(x, compression="nosuch:ratio=0.1", name="x")
    with pytest.raises(gradcomm.InvalidArgument, match="key"):
        gradcomm.allreduce(x, compression="topk:ratio=0.5")  # stateful: needs a name
    with pytest.raises(gradcomm.InvalidArgument, match="float32"):
        gradcomm.allreduce(np.ones(8, np.float64), compression="topk:ratio=0.5", name="d")
    with pytest.raises(gradcomm.InvalidArgument, match="root 1 out of range"):
        gradcomm.broadcast(x, root=1)
    with pytest.raises(gradcomm.InvalidArgument, match="output has 3 elements"):
        gradcomm.allgather(x, out=np.zeros(3, np.float32))
    # A wrong argument does not break the communicator.
    gradcomm.allreduce(x)


def test_cuda_tensor_is_passed_through_and_refused_as_unsupported(world_of_one):
    # No CUDA torch here: drive the module layer the package uses for a CUDA tensor.
    x = np.zeros(4, np.float32)
    with pytest.raises(gradcomm.Unsupported, match="CUDA"):
        _gradcomm.allreduce_async(x.ctypes.data, 4, "float32", "cuda", 0, 0, "sum", "none", "")


# ---- state -----------------------------------------------------------------------------

def test_state_dict_roundtrip_restores_error_feedback(world_of_one):
    rng = np.random.default_rng(0)
    g = rng.standard_normal(200).astype(np.float32)
    gradcomm.allreduce(g.copy(), compression="topk:ratio=0.1", name="w")  # leaves a residual
    saved = gradcomm.state_dict()
    assert saved["format"] == "gradcomm.state/1" and isinstance(saved["state"], bytes)
    first = gradcomm.allreduce(g.copy(), compression="topk:ratio=0.1", name="w")
    after = gradcomm.allreduce(g.copy(), compression="topk:ratio=0.1", name="w")
    assert not np.array_equal(first, after)  # the residual moved on
    gradcomm.load_state_dict(saved)
    again = gradcomm.allreduce(g.copy(), compression="topk:ratio=0.1", name="w")
    np.testing.assert_array_equal(first, again)


def test_load_state_dict_rejects_bad_input(world_of_one):
    good = gradcomm.state_dict()
    with pytest.raises(TypeError):
        gradcomm.load_state_dict(b"raw bytes")
    with pytest.raises(ValueError, match="format"):
        gradcomm.load_state_dict({"state": good["state"]})
    bad = dict(good, state=b"\x00garbage" * 7)
    with pytest.raises(gradcomm.CorruptPayload):
        gradcomm.load_state_dict(bad)
    with pytest.raises(ValueError):  # CorruptPayload is also a ValueError
        gradcomm.load_state_dict(dict(good, state=good["state"][:-1] if good["state"] else b"x"))
    gradcomm.load_state_dict(good)


def test_stats_counts_ops(world_of_one):
    before = gradcomm.stats()["ops"]
    gradcomm.allreduce(np.ones(4, np.float32))
    gradcomm.barrier()
    assert gradcomm.stats()["ops"] == before + 2


# ---- rendezvous through a Python store object ------------------------------------------

def test_python_store_wait_timeout_is_timeout_error():
    torch = pytest.importorskip("torch")
    store = torch.distributed.HashStore()
    prefix = f"gradcomm/init{gradcomm._python_store_inits}/"
    # The first record every rank publishes and reads is its node (the topology, which the
    # transport's lanes follow); a missing rank is named there.
    with pytest.raises(gradcomm.TimeoutError, match=f"waiting for rank 1 to publish its node .*{prefix}gradcomm/g1/comm/node/1"):
        gradcomm.init(rank=0, world_size=2, store=store, timeout=0.5)
    assert not gradcomm.is_initialized()
    # Rank 0 published its node under our prefix, not a bare key torch might use.
    assert len(store.get(f"{prefix}gradcomm/g1/comm/node/0")) > 0
    # A second init uses a new prefix: it can never read the first one's addresses.
    assert gradcomm._python_store_inits == int(prefix.split("init")[1].rstrip("/")) + 1


def test_python_store_failure_is_transport_error_naming_the_call():
    class FailingStore:
        def set(self, key, value):
            raise OSError("disk full")

        def get(self, key):
            return b""

        def add(self, key, delta):
            return 1

        def wait(self, keys, timeout):
            pass

    # The first set is this rank's join record in generation 1 (store/rendezvous.h).
    with pytest.raises(gradcomm.TransportError, match=r"set\('gradcomm/init\d+/gradcomm/g1/join/0'\) raised: "
                                                      r"OSError: disk full$"):
        gradcomm.init(rank=0, world_size=2, store=FailingStore(), timeout=1)
    assert not gradcomm.is_initialized()


def test_python_store_polls_compare_set_and_never_waits():
    # torch 1.13's TCPStore.wait() with a deadline that expires leaves its connection out
    # of step (the server's late STOP_WAITING is read as the next reply), so a store with
    # compare_set is polled through it, changing nothing, and wait() is never called.
    class DictStore:
        def __init__(self):
            self.d, self.waits, self.probes = {}, 0, 0

        def set(self, key, value):
            self.d[key] = value if isinstance(value, bytes) else value.encode()

        def get(self, key):
            return self.d[key]

        def add(self, key, delta):
            self.d[key] = str(int(self.d.get(key, b"0")) + delta).encode()
            return int(self.d[key])

        def compare_set(self, key, expected, desired):
            self.probes += 1
            if key not in self.d:
                return expected.encode() if isinstance(expected, str) else expected
            return self.d[key]

        def wait(self, keys, timeout):
            self.waits += 1
            raise AssertionError("wait() called")

    store = DictStore()
    with pytest.raises(gradcomm.TimeoutError, match=r"waiting for rank 1 to publish its node .*gradcomm/g1/comm/node/1"):
        gradcomm.init(rank=0, world_size=2, store=store, timeout=0.5)
    assert store.waits == 0 and store.probes > 0
    # The probe changed nothing: only what rank 0 set is there (its join record,
    # counter and node), no key of rank 1's.
    assert not [k for k in store.d if k.endswith("/1")], sorted(store.d)


def test_python_store_tcp_store_with_late_ranks():
    # Real torch TCPStores, rank 0 hosting; ranks 1 and 2 come 1.5 s apart, so the
    # rendezvous keeps looking for keys that are not there yet.
    pytest.importorskip("torch")
    from conftest import PYTHON, WORKERS, _free_port
    import subprocess
    port, n = _free_port(), 3
    procs = [subprocess.Popen([PYTHON, f"{WORKERS}/tcp_store_late_rank.py", str(port), str(r), str(n), "1.5"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(n)]
    outputs = []
    try:
        for p in procs:
            outputs.append(p.communicate(timeout=120)[0])
    finally:
        for p in procs:
            p.kill()
    for r, (p, out) in enumerate(zip(procs, outputs)):
        assert p.returncode == 0 and f"OK tcp-store rank={r}" in out, f"rank {r}: exit {p.returncode}\n{out}"
