"""gradcomm: compressed and dense collectives for data-parallel training.

    import gradcomm
    gradcomm.init()                                   # rank/size/store from the environment
    gradcomm.allreduce(x, op="avg", compression="topk:ratio=0.01", name="fc1.weight")  # in place
    gradcomm.allgather(x); gradcomm.broadcast(x, root=0); gradcomm.barrier()

`x` is a numpy array or a torch tensor (CPU; CUDA tensors are passed through with
torch's current stream), contiguous. The GIL is released while a collective runs.
Errors are gradcomm.Error subclasses (gradcomm.InvalidArgument is also a
ValueError, gradcomm.TimeoutError also the builtin TimeoutError, ...); an input of
the wrong kind is a TypeError, a non-contiguous or read-only one a ValueError.

For PyTorch: gradcomm.torch has the DDP communication hook
(CompressionHookState, compression_hook) and DistributedOptimizer.
"""
import atexit as _atexit
import datetime as _datetime
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
    "init", "shutdown", "is_initialized", "rank", "size",
    "allreduce", "allgather", "broadcast", "barrier",
    "state_dict", "load_state_dict", "stats",
    "Error", "InvalidArgument", "Unsupported", "TimeoutError", "PeerFailure",
    "MismatchError", "CorruptPayload", "TransportError", "CudaError",
]

# How the current communicator found its peers: "torch.distributed" (torch's own
# store), "store" (a store object passed to init), "environment" (DESIGN section 6).
_init_source = None
# Inits that went through a Python store in this process. Every rank makes the
# same sequence of init() calls, so the count is the same on every rank and
# prefixes each init's keys: a second init never reads the first one's addresses.
_python_store_inits = 0


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
    global _init_source, _python_store_inits
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

    prefix = ""
    if py_store is not None:
        prefix = f"gradcomm/init{_python_store_inits}/"
        _python_store_inits += 1
    _C.init(-1 if rank is None else rank, -1 if world_size is None else world_size, url, transport, timeout_ms,
            job_token or "", py_store, prefix, address)
    _init_source = source


def shutdown():
    """Destroys the communicator (no-op when not initialized). Registered with atexit."""
    global _init_source
    _C.shutdown()
    _init_source = None


_atexit.register(shutdown)


def is_initialized():
    return _C.is_initialized()


def rank():
    return _C.rank()


def size():
    return _C.size()


def _check_str(value, call, name):
    if not isinstance(value, str):
        raise TypeError(f"gradcomm.{call}: {name} must be a str, got {type(value).__name__}")


def allreduce(x, op="sum", compression="none", name=None):
    """Reduces `x` across ranks in place and returns it.

    op: "sum" | "avg" | "min" | "max" (min/max dense only). compression: a spec
    string ("topk:ratio=0.01", "qsgd:levels=16", ...; compressors take float32).
    name: the key of this tensor's compression state (error feedback, step
    counter); required for stateful compressors, the same on every rank.
    """
    _check_str(op, "allreduce", "op")
    _check_str(compression, "allreduce", "compression")
    if name is not None:
        _check_str(name, "allreduce", "name")
    b = _tensors.describe(x, "allreduce", "tensor", writable=True)
    _C.allreduce(b.data, b.numel, b.dtype, b.device, b.device_index, b.stream, op, compression, name or "")
    return x


def allgather(x, out=None):
    """Gathers every rank's `x`: returns `out` of shape (size(), *x.shape), rank r's
    input at out[r]. `out` (optional) must be contiguous, of x's dtype and device,
    with size() * x.numel elements."""
    b = _tensors.describe(x, "allgather", "input", writable=False)
    if out is None:
        out = _tensors.empty_like_gathered(x, _C.size())
    o = _tensors.describe(out, "allgather", "out", writable=True)
    if (o.device, o.device_index) != (b.device, b.device_index):
        raise ValueError(f"gradcomm.allgather: input is on {b.device}:{b.device_index} but out on "
                         f"{o.device}:{o.device_index}")
    if o.dtype != b.dtype:
        raise TypeError(f"gradcomm.allgather: input is {b.dtype} but out is {o.dtype}")
    _C.allgather(b.data, o.data, b.numel, o.numel, b.dtype, b.device, b.device_index)
    return out


def broadcast(x, root=0):
    """Copies rank `root`'s `x` into every rank's `x` (in place); returns x."""
    if not isinstance(root, int):
        raise TypeError(f"gradcomm.broadcast: root must be an int, got {type(root).__name__}")
    b = _tensors.describe(x, "broadcast", "tensor", writable=True)
    _C.broadcast(b.data, b.numel, b.dtype, b.device, b.device_index, root)
    return x


def barrier():
    _C.barrier()


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
    """Counters since init: bytes_sent/bytes_received on the wire, messages_sent,
    ops, and seconds: total_s = reduce_s + encode_s + decode_s + comm_s."""
    return _C.stats()
