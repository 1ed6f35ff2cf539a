"""gradcomm: compressed and dense collectives for data-parallel training.

    import gradcomm
    gradcomm.init()                                   # rank/size/store from the environment
    gradcomm.allreduce(x, op="avg", compression="topk:ratio=0.01", name="fc1.weight")  # in place
    gradcomm.allgather(x); gradcomm.reduce_scatter(x); gradcomm.broadcast(x, root=0); gradcomm.barrier()
    h = gradcomm.allreduce_async(x, op="avg"); ...; h.wait()   # overlaps the caller's work

`x` is a numpy array or a torch tensor (CPU; CUDA tensors are passed through with
torch's current stream), contiguous. The GIL is released while a collective runs.
Calls run in issue order on a thread of the communicator's; every rank must issue
the same sequence. An *_async call returns a Work at once; keep its tensors alive
and untouched until wait() returns (the Work holds a reference to them).
Errors are gradcomm.Error subclasses (gradcomm.InvalidArgument is also a
ValueError, gradcomm.TimeoutError also the builtin TimeoutError, ...); an input of
the wrong kind is a TypeError, a non-contiguous or read-only one a ValueError.

For PyTorch: gradcomm.torch has the DDP communication hook
(CompressionHookState, compression_hook) and DistributedOptimizer.
"""
import atexit as _atexit
import builtins as _builtins
import datetime as _datetime
import operator as _operator
import os as _os
import sys as _sys

from . import _gradcomm as _C
from . import _tensors
from ._gradcomm import (  # noqa: F401  (re-exported: the public exception classes)
    CorruptPayload,
    CudaError,
    Error,
    InvalidArgument,
    MismatchError,
    PeerFailure,
    TimeoutError,
    TransportError,
    Unsupported,
)

__version__ = _C.__version__
built_with_cuda = _C.built_with_cuda

__all__ = [
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "topology",
    "allreduce", "allgather", "reduce_scatter", "broadcast", "barrier", "alloc_shared",
    "allreduce_async", "allgather_async", "reduce_scatter_async", "broadcast_async", "Work",
    "state_dict", "load_state_dict", "stats",
    "Error", "InvalidArgument", "Unsupported", "TimeoutError", "PeerFailure",
    "MismatchError", "CorruptPayload", "TransportError", "CudaError",
]

# How the current communicator found its peers: "torch.distributed" (torch's own
# store), "store" (a store object passed to init), "environment" (docs/architecture.md,
# launching and rendezvous).
_init_source = None
# A store whose server this process serves for the job (torchrun's MASTER_PORT store):
# held until shutdown(), since the server stops with its last reference.
_served_store = None
# Inits that went through a Python store in this process. Every rank makes the
# same sequence of init() calls, so the count is the same on every rank and
# prefixes each init's keys: a second init never reads the first one's addresses.
_python_store_inits = 0
# This process's rank among the ranks on its host (local_rank()), set by init().
_local_rank = None

# Launchers' names for the local rank, in the order they are trusted.
_LOCAL_RANK_VARIABLES = ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "PMI_LOCAL_RANK",
                         "SLURM_LOCALID")


def _default_torch_store():
    """torch.distributed's default store (and rank, size) when a torch.distributed
    job is initialized in this process, else None. Never imports torch itself."""
    if "torch" not in _sys.modules:
        return None
    try:
        import torch.distributed as dist
    except ImportError:
        return None
    if not (dist.is_available() and dist.is_initialized()):
        return None
    return dist.distributed_c10d._get_default_store(), dist.get_rank(), dist.get_world_size()


def init(rank=None, world_size=None, store=None, transport="auto", timeout=None, job_token=None):
    """Creates this process's communicator; blocks until every rank has joined.

    Rank and world size come from the arguments, else the environment (RANK/WORLD_SIZE,
    OMPI_COMM_WORLD_*, PMI_*, SLURM_*). The rendezvous goes through, in order: `store`
    (a URL "tcp://host:port" | "file:///dir", or a torch.distributed Store object);
    torch.distributed's own store when a torch.distributed job is initialized (rank and
    size then default to torch's); GRADCOMM_STORE; tcp://MASTER_ADDR:MASTER_PORT.
    `timeout` is in seconds (default 300 or GRADCOMM_TIMEOUT_S). Calling init() again
    while initialized does nothing; after shutdown() it creates a new communicator.
    """
    global _init_source, _python_store_inits, _served_store
    if _C.is_initialized():
        return
    if rank is not None and not isinstance(rank, int):
        raise TypeError(f"gradcomm.init: rank must be an int, got {type(rank).__name__}")
    if world_size is not None and not isinstance(world_size, int):
        raise TypeError(f"gradcomm.init: world_size must be an int, got {type(world_size).__name__}")
    if not isinstance(transport, str):
        raise TypeError(f"gradcomm.init: transport must be a str, got {type(transport).__name__}")
    if job_token is not None and not isinstance(job_token, str):
        raise TypeError("gradcomm.init: job_token must be a str")
    timeout_ms = 0
    if timeout is not None:
        if isinstance(timeout, _datetime.timedelta):
            timeout = timeout.total_seconds()
        if not isinstance(timeout, (int, float)) or not timeout > 0:
            raise ValueError(f"gradcomm.init: timeout must be a positive number of seconds, got {timeout!r}")
        timeout_ms = max(1, int(round(timeout * 1000)))

    py_store, url, source, address = None, "", "environment", ""
    if isinstance(store, str):
        url, source = store, "environment"
    elif store is not None:
        for method in ("set", "get", "add", "wait"):
            if not callable(getattr(store, method, None)):
                raise TypeError(
                    f"gradcomm.init: store must be a URL string or an object with set/get/add/wait "
                    f"(a torch.distributed Store); {type(store).__name__} has no {method}()")
        py_store, source = store, "store"
        address = f"Python store ({type(store).__name__})"
    else:
        found = _default_torch_store()
        if found is not None:
            py_store, torch_rank, torch_size = found
            rank = torch_rank if rank is None else rank
            world_size = torch_size if world_size is None else world_size
            source = "torch.distributed"
            address = f"torch.distributed store ({type(py_store).__name__})"

    served = None
    if py_store is None and not url:
        url, py_store, address = _store_beside_torch(rank, world_size, timeout)
        if py_store is not None:
            source = "torch.distributed"
            served = py_store

    prefix = ""
    if py_store is not None:
        prefix = f"gradcomm/init{_python_store_inits}/"
        _python_store_inits += 1
    _C.init(-1 if rank is None else rank, -1 if world_size is None else world_size, url, transport, timeout_ms,
            job_token or "", py_store, prefix, address)
    _init_source = source
    _served_store = served
    global _local_rank
    _local_rank = _find_local_rank()


def _store_beside_torch(rank, world_size, timeout):
    """(url, store, address) when the environment's store would be
    tcp://MASTER_ADDR:MASTER_PORT: that port belongs to torch.distributed, which a
    later init_process_group (env://) binds on rank 0, so gradcomm must not take it.
    Under torchrun (TORCHELASTIC_USE_AGENT_STORE=True) the agent already serves a
    store there: gradcomm joins it as a client, as torch's own workers do. Under
    torchrun's other rendezvous, gradcomm serves torch's multi-tenant store on
    MASTER_PORT (shared with a later env:// init in the same process). Otherwise
    gradcomm serves its own store on MASTER_PORT + 1. ("", None, "") when
    GRADCOMM_STORE is set or MASTER_ADDR/MASTER_PORT are not: the C++ rules apply."""
    addr, port = _os.environ.get("MASTER_ADDR"), _os.environ.get("MASTER_PORT")
    if _os.environ.get("GRADCOMM_STORE") or not addr or not port:
        return "", None, ""
    try:
        port = int(port)
    except ValueError:
        return "", None, ""  # the C++ side names the bad value
    seconds = 300 if timeout is None else float(timeout)
    if _os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        from torch.distributed import TCPStore  # under torchrun, torch is there
        store = TCPStore(addr, port, is_master=False, timeout=_datetime.timedelta(seconds=seconds))
        return "", store, f"torchrun agent store ({addr}:{port})"
    if _os.environ.get("TORCHELASTIC_RUN_ID"):
        # torchrun with a c10d/etcd rendezvous: MASTER_PORT is a port the agent had the
        # kernel hand out and then released, and MASTER_PORT + 1 is reserved by nobody (any
        # outgoing connection may hold it). Serve torch's own multi-tenant store there
        # instead: a later init_process_group (env://) in this process shares the server,
        # as torch's own stores do.
        rank = rank if rank is not None else _env_int("RANK")
        world_size = world_size if world_size is not None else _env_int("WORLD_SIZE")
        if rank is not None and world_size is not None:
            from torch.distributed import TCPStore
            store = TCPStore(addr, port, world_size, rank == 0, _datetime.timedelta(seconds=seconds),
                             wait_for_workers=False, multi_tenant=True)
            return "", store, f"torchrun's MASTER_PORT store ({addr}:{port}, shared with torch.distributed)"
    if not 0 < port < 65535:
        return "", None, ""
    return f"tcp://{addr}:{port + 1}", None, ""


def _env_int(name):
    value = _os.environ.get(name, "").strip()
    return int(value) if value.isdigit() else None


def _find_local_rank():
    """The launcher's local rank; without one, this rank's place among the ranks of its
    node (topology(); a node is a host unless GRADCOMM_NODE names it)."""
    for name in _LOCAL_RANK_VARIABLES:
        value = _os.environ.get(name)
        if value is not None and value.strip().isdigit():
            return int(value)
    return _C.topology()["local_rank"]


def local_rank():
    """This process's rank among the ranks on its host (LOCAL_RANK and the other
    launchers' variables; else counted from the ranks' host names at init)."""
    if _local_rank is None:
        raise Error("gradcomm.local_rank: gradcomm is not initialized; call gradcomm.init() first")
    return _local_rank


def shutdown():
    """Destroys the communicator (no-op when not initialized). Registered with atexit."""
    global _init_source, _served_store
    _C.shutdown()
    _init_source = None
    _served_store = None


_atexit.register(shutdown)


def _forget_after_fork():
    """A forked child has no engine thread: its copy of the communicator is dropped
    unused (gradcomm.init() there makes a new one)."""
    global _init_source, _local_rank
    _C.forget_after_fork()
    _init_source = _local_rank = None


_os.register_at_fork(after_in_child=_forget_after_fork)


def is_initialized():
    return _C.is_initialized()


def topology():
    """Which ranks share this rank's node, as a dict: nodes (how many), node (this rank's,
    numbered by their lowest rank), local_rank and local_size (its place among its node's
    ranks, and how many those are), node_name (GRADCOMM_NODE, or "hostname/boot id") and
    node_of_rank (every rank's node). Fixed at init; the same on every rank."""
    return _C.topology()


def rank():
    return _C.rank()


def size():
    return _C.size()


def _check_str(value, call, name):
    if not isinstance(value, str):
        raise TypeError(f"gradcomm.{call}: {name} must be a str, got {type(value).__name__}")


class Work:
    """A collective in flight, from allreduce_async, allgather_async or
    broadcast_async. It holds its tensors until it completes."""

    __slots__ = ("_work", "_result", "_tensors")

    def __init__(self, work, result, tensors):
        self._work = work
        self._result = result
        self._tensors = tensors  # kept alive until the call is done

    def wait(self, timeout=None):
        """Blocks until the call has completed and returns its result (the tensor it
        wrote); raises the call's error (gradcomm.MismatchError, PeerFailure, ...).
        With `timeout` (seconds), raises the builtin TimeoutError when it passes;
        the call goes on and can be waited on again."""
        ms = -1
        if timeout is not None:
            if isinstance(timeout, _datetime.timedelta):
                timeout = timeout.total_seconds()
            if not isinstance(timeout, (int, float)) or timeout < 0:
                raise ValueError(f"Work.wait: timeout must be a number of seconds >= 0, got {timeout!r}")
            ms = int(round(timeout * 1000))
        return self._wait(ms, False, timeout)

    def needed(self):
        """Says that the program needs the result from now on, without waiting
        (compressor="auto" measures how long a call's wire may hide behind the
        program's own work up to here, or up to its first wait). For code that waits
        on a thread of its own on the program's behalf, as the DDP hook does."""
        self._work.needed()

    def _wait(self, ms, helper, timeout=None):
        # helper: this thread waits on the program's behalf; its wait is not the
        # program needing the result (needed()).
        if not self._work.wait(ms, helper):
            raise _builtins.TimeoutError(f"gradcomm: Work.wait timed out after {timeout} s; the call is still running")
        self._tensors = None
        return self._result

    def is_completed(self):
        """True once the call has completed (successfully or not); never blocks."""
        return self._work.is_completed()


def _shape_list(value, call, what):
    try:
        return [_operator.index(d) for d in value]
    except TypeError:
        raise TypeError(f"gradcomm.{call}: {what} must be a sequence of ints, got {value!r}") from None


def _allreduce_args(x, op, compression, name, parts, call):
    _check_str(op, call, "op")
    _check_str(compression, call, "compression")
    if name is not None:
        _check_str(name, call, "name")
    b = _tensors.describe(x, call, "tensor", writable=True)
    if parts is None:
        shape, part_list = [int(d) for d in x.shape], []
    else:
        if isinstance(parts, (str, bytes)) or not hasattr(parts, "__iter__"):
            raise TypeError(f"gradcomm.{call}: parts must be a list of shapes, got {type(parts).__name__}")
        shape, part_list = [], [_shape_list(p, call, "each of parts") for p in parts]
    return (b.data, b.numel, b.dtype, b.device, b.device_index, b.stream, op, compression, name or "", shape,
            part_list)


def allreduce(x, op="sum", compression="none", name=None, parts=None):
    """Reduces `x` across ranks in place and returns it.

    op: "sum" | "avg" | "min" | "max" (min/max dense only). compression: a spec
    string ("topk:ratio=0.01", "qsgd:levels=16", "powersgd:rank=4", ...; compressors
    take float32, and the codecs and top-k float16/bfloat16 CPU tensors too). name: the key of this tensor's compression state (error
    feedback, step counter); required for stateful compressors, the same on every
    rank. x's shape goes with the call (powersgd views a tensor of 2+ dimensions as
    shape[0] rows); parts: instead, the shapes of several tensors laid end to end
    in a flat x (a DDP bucket), each viewed on its own.
    """
    _C.allreduce_async(*_allreduce_args(x, op, compression, name, parts, "allreduce")).wait()
    return x


def allreduce_async(x, op="sum", compression="none", name=None, parts=None):
    """allreduce() without waiting: returns a Work whose wait() returns `x`. Do not
    read or write `x` until then. Small calls issued together may travel as one
    (fusion: GRADCOMM_FUSION_BYTES, GRADCOMM_CYCLE_MS)."""
    work = _C.allreduce_async(*_allreduce_args(x, op, compression, name, parts, "allreduce_async"))
    return Work(work, x, (x,))


def _describe_out(b, out, call):
    """The output buffer of a two-buffer call, on the input's device, of its dtype."""
    o = _tensors.describe(out, call, "out", writable=True)
    if (o.device, o.device_index) != (b.device, b.device_index):
        raise ValueError(f"gradcomm.{call}: input is on {b.device}:{b.device_index} but out on "
                         f"{o.device}:{o.device_index}")
    if o.dtype != b.dtype:
        raise TypeError(f"gradcomm.{call}: input is {b.dtype} but out is {o.dtype}")
    return o


def _allgather_args(x, out, call):
    b = _tensors.describe(x, call, "input", writable=False)
    if out is None:
        out = _tensors.empty_like_gathered(x, _C.size())
    o = _describe_out(b, out, call)
    return out, (b.data, o.data, b.numel, o.numel, b.dtype, b.device, b.device_index)


def allgather(x, out=None):
    """Gathers every rank's `x`: returns `out` of shape (size(), *x.shape), rank r's
    input at out[r]. `out` (optional) must be contiguous, of x's dtype and device,
    with size() * x.numel elements."""
    out, args = _allgather_args(x, out, "allgather")
    _C.allgather_async(*args).wait()
    return out


def allgather_async(x, out=None):
    """allgather() without waiting: returns a Work whose wait() returns `out`."""
    out, args = _allgather_args(x, out, "allgather_async")
    return Work(_C.allgather_async(*args), out, (x, out))


def _reduce_scatter_args(x, out, op, compression, name, call):
    b = _tensors.describe(x, call, "input", writable=False)
    n = _C.size()
    if out is None:
        shape = tuple(x.shape)
        if len(shape) >= 2 and shape[0] == n:
            out = _tensors.empty_like_shape(x, shape[1:])
        elif b.numel % n == 0:
            out = _tensors.empty_like_shape(x, (b.numel // n,))
        else:
            raise ValueError(f"gradcomm.{call}: input has {b.numel} elements, not a multiple of size() = {n}")
    o = _describe_out(b, out, call)
    return out, (b.data, o.data, b.numel, o.numel, b.dtype, b.device, b.device_index, op, compression or "none",
                 name or "")


def reduce_scatter(x, out=None, op="sum", compression="none", name=None):
    """Reduces `x` over the ranks (op: sum, avg, min, max) and returns this rank's
    share: rank r gets elements [r * m, (r + 1) * m) of the reduced x, m = x.numel /
    size(). `out` defaults to x.shape[1:] when x is (size(), ...), else a flat array of
    m elements; a given `out` must be contiguous, of x's dtype and device, with m
    elements. `x` is left unchanged. compression (float32 CPU arrays, or float16/bfloat16
    ones, sum or avg): a
    spec of the compressed ring's codecs (fp16, bf16, quant, qsgd, sign), a payload per
    hop; or top-k, each rank sending each segment's owner the entries of its selection
    there; `name` keys its state (error feedback) as allreduce's does."""
    out, args = _reduce_scatter_args(x, out, op, compression, name, "reduce_scatter")
    _C.reduce_scatter_async(*args).wait()
    return out


def reduce_scatter_async(x, out=None, op="sum", compression="none", name=None):
    """reduce_scatter() without waiting: returns a Work whose wait() returns `out`."""
    out, args = _reduce_scatter_args(x, out, op, compression, name, "reduce_scatter_async")
    return Work(_C.reduce_scatter_async(*args), out, (x, out))


def _broadcast_args(x, root, call):
    if not isinstance(root, int):
        raise TypeError(f"gradcomm.{call}: root must be an int, got {type(root).__name__}")
    b = _tensors.describe(x, call, "tensor", writable=True)
    return (b.data, b.numel, b.dtype, b.device, b.device_index, root)


def broadcast(x, root=0):
    """Copies rank `root`'s `x` into every rank's `x` (in place); returns x."""
    _C.broadcast_async(*_broadcast_args(x, root, "broadcast")).wait()
    return x


def broadcast_async(x, root=0):
    """broadcast() without waiting: returns a Work whose wait() returns `x`."""
    return Work(_C.broadcast_async(*_broadcast_args(x, root, "broadcast_async")), x, (x,))


def barrier():
    _C.barrier()


def alloc_shared(nbytes):
    """`nbytes` of host memory that the ranks on this rank's node read in place: an
    allreduce of the same part of it on every rank (past 16 KiB) reduces straight from
    the ranks' buffers instead of copying them through the node's segment
    (docs/shared-memory.md, "Shared buffers"). A collective: every rank calls it with the
    same nbytes, in the same order as its other calls. Returns a buffer for
    numpy.frombuffer(b, dtype) or torch.frombuffer(b, dtype=...) (which keep it alive);
    zero-filled; `.shared` is False where the node has no segment (plain memory then).
    MismatchError when the ranks asked for different sizes, TransportError when a rank
    could not make or map its block. A forked child shares the memory with its parent:
    it must not write it."""
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes <= 0:
        raise InvalidArgument(f"gradcomm.alloc_shared: nbytes must be a positive int, got {nbytes!r}")
    return _C.alloc_shared(nbytes)


_STATE_FORMAT = "gradcomm.state/1"


def state_dict():
    """All compression state (error-feedback residuals, step counters) of this rank,
    as a dict that torch.save/pickle can store. Restore with load_state_dict()."""
    return {"format": _STATE_FORMAT, "rank": _C.rank(), "world_size": _C.size(), "state": _C.save_state()}


def load_state_dict(state):
    """Restores what state_dict() returned (on the same rank of a job of the same
    size). The bytes are validated: CorruptPayload on bad input; all or nothing."""
    if not isinstance(state, dict):
        raise TypeError(f"gradcomm.load_state_dict: expected the dict state_dict() returns, got {type(state).__name__}")
    if state.get("format") != _STATE_FORMAT:
        raise ValueError(f"gradcomm.load_state_dict: 'format' is {state.get('format')!r}, expected {_STATE_FORMAT!r}")
    data = state.get("state")
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"gradcomm.load_state_dict: 'state' must be bytes, got {type(data).__name__}")
    _C.load_state(bytes(data))


def stats():
    """Counters of the calls completed since init: bytes_sent/bytes_received on the
    wire, messages_sent, ops (fused_calls of them travelled fused), and seconds:
    total_s = reduce_s + encode_s + decode_s + comm_s (wall time inside collectives);
    engine_cpu_s, the CPU time of the engine thread that runs them; node_shm_ops, the
    collectives that ran on the node's shared segment (no wire bytes: docs/shared-memory.md),
    inline_ops, those of them that ran on the calling thread (small blocking calls).
    A "gradcomm" torch.distributed process group has its own communicator and counters:
    gradcomm.torch.stats(group)."""
    if not is_initialized():
        torch_module = _sys.modules.get("gradcomm.torch")
        if torch_module is not None and len(torch_module._live_groups):
            raise Error("gradcomm.stats: gradcomm.init() was not called, so there are no counters here; a "
                        "\"gradcomm\" torch.distributed process group keeps its own: "
                        "gradcomm.torch.stats(group) (None: the default group)")
    return _C.stats()
