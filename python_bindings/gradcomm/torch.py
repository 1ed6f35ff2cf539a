"""PyTorch integration: a DDP communication hook and a Horovod-style optimizer.

DDP (torch.nn.parallel.DistributedDataParallel, any process group, e.g. gloo):

    state = CompressionHookState(compression="topk:ratio=0.01")
    ddp_model.register_comm_hook(state, compression_hook)

Without DDP:

    opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                               model.named_parameters(), compression="qsgd:levels=16")
    loss.backward(); opt.step()      # allreduces every gradient, then steps

Both average like DDP (sum over ranks divided by the world size) and keep the
compression state (error feedback) under a key that names the same gradients on
every rank and in every iteration. gradcomm.init() is called on first use when the
caller has not called it (inside a torch.distributed job it uses torch's store).
"""
import weakref

import torch
import torch.distributed

import gradcomm

# DDP checks a hook's annotations against these exact objects.
_GradBucket = torch.distributed.GradBucket if torch.distributed.is_available() else object

__all__ = ["CompressionHookState", "compression_hook", "DistributedOptimizer"]


def _dense_only(tensor, compression, min_compress_numel):
    # Compressors take float32; other dtypes and small tensors go dense, which is
    # exact, never a silently different result.
    return compression == "none" or tensor.dtype != torch.float32 or tensor.numel() < min_compress_numel


class CompressionHookState:
    """State of compression_hook for one DDP model.

    compression: gradcomm spec string ("topk:ratio=0.01", "qsgd:levels=16,bucket=512", ...).
    min_compress_numel: buckets with fewer elements are allreduced dense.
    start_iter: iterations before this one are allreduced dense. The default 1 keeps
        the first iteration dense: DDP rebuilds its buckets after it, so compression
        state is only ever created for the buckets DDP keeps (see bucket_key()).
    """

    def __init__(self, compression="topk:ratio=0.01", min_compress_numel=0, start_iter=1):
        if not isinstance(compression, str):
            raise TypeError(f"CompressionHookState: compression must be a spec string, got {type(compression).__name__}")
        if not isinstance(min_compress_numel, int) or min_compress_numel < 0:
            raise ValueError(f"CompressionHookState: min_compress_numel must be an int >= 0, got {min_compress_numel!r}")
        if not isinstance(start_iter, int) or start_iter < 0:
            raise ValueError(f"CompressionHookState: start_iter must be an int >= 0, got {start_iter!r}")
        self.compression = compression
        self.min_compress_numel = min_compress_numel
        self.start_iter = start_iter
        self.iter = 0  # completed backward passes (counted at each iteration's last bucket)
        self.keys = set()  # the compression-state keys used so far
        # Parameter -> ordinal, assigned in the order parameters are first seen.
        # DDP calls the hook in bucket order and its buckets are the same on every
        # rank, so ordinals agree across ranks; they follow the parameter objects,
        # not bucket.index(), so a bucket's key survives DDP's bucket rebuild.
        self._ordinals = {}  # id(param) -> (weakref to param, ordinal)
        self._next_ordinal = 0

    def _ordinal(self, param):
        entry = self._ordinals.get(id(param))
        if entry is not None and entry[0]() is param:
            return entry[1]
        ordinal = self._next_ordinal
        self._next_ordinal += 1
        self._ordinals[id(param)] = (weakref.ref(param), ordinal)
        return ordinal

    def bucket_key(self, bucket):
        """The compression-state key of a bucket: its parameters' ordinals (as ranges)
        and element count, e.g. "ddp/p0-3,7/n1290". Identical buckets in later
        iterations get the same key; a rebuilt bucket holding different parameters a
        new one, so error feedback never mixes gradients of different parameters."""
        ordinals = [self._ordinal(p) for p in bucket.parameters()]
        ranges, start = [], None
        for i, o in enumerate(ordinals):
            if start is None:
                start = o
            if i + 1 == len(ordinals) or ordinals[i + 1] != o + 1:
                ranges.append(f"{start}" if start == o else f"{start}-{o}")
                start = None
        return f"ddp/p{','.join(ranges)}/n{bucket.buffer().numel()}"


def compression_hook(state: CompressionHookState, bucket: _GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: averages the bucket over all ranks with gradcomm,
    compressed as `state` says. Register with
    ddp_model.register_comm_hook(state, compression_hook).

    The allreduce runs synchronously (the GIL released) and the returned future is
    already complete; every rank ends with bitwise the same averaged gradients."""
    if not gradcomm.is_initialized():
        gradcomm.init()
    buffer = bucket.buffer()
    if state.iter < state.start_iter or _dense_only(buffer, state.compression, state.min_compress_numel):
        gradcomm.allreduce(buffer, op="avg")
    else:
        key = state.bucket_key(bucket)
        state.keys.add(key)
        gradcomm.allreduce(buffer, op="avg", compression=state.compression, name=key)
    if bucket.is_last():
        state.iter += 1
    future = torch.futures.Future()
    future.set_result(buffer)
    return future


class _DistributedOptimizer(torch.optim.Optimizer):
    """Methods mixed into a subclass of the wrapped optimizer's class (see
    DistributedOptimizer): isinstance(opt, torch.optim.SGD) stays true, so LR
    schedulers and checkpoints work as before."""

    def __init__(self, params, names, compression, min_compress_numel):
        self._gradcomm_base.__init__(self, params)
        self._gradcomm_names = names  # id(param) -> name
        self._gradcomm_compression = compression
        self._gradcomm_min_compress_numel = min_compress_numel

    def synchronize(self):
        """Averages every parameter's gradient over all ranks (in place). A parameter
        without a gradient gets a zero one first, so every rank makes the same calls."""
        if not gradcomm.is_initialized():
            gradcomm.init()
        for group in self.param_groups:
            for p in group["params"]:
                if not p.requires_grad:
                    continue
                if p.grad is None:
                    p.grad = torch.zeros_like(p, memory_format=torch.contiguous_format)
                grad = p.grad
                if grad.is_sparse:
                    raise TypeError(f"DistributedOptimizer: parameter '{self._gradcomm_names[id(p)]}' has a sparse "
                                    "gradient; gradcomm reduces dense gradients only")
                contiguous = grad if grad.is_contiguous() else grad.contiguous()
                name = self._gradcomm_names[id(p)]
                if _dense_only(contiguous, self._gradcomm_compression, self._gradcomm_min_compress_numel):
                    gradcomm.allreduce(contiguous, op="avg")
                else:
                    gradcomm.allreduce(contiguous, op="avg", compression=self._gradcomm_compression, name=name)
                if contiguous is not grad:
                    grad.copy_(contiguous)

    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.synchronize()
        self._gradcomm_base.step(self)
        return loss


def DistributedOptimizer(optimizer, named_parameters=None, compression="none", min_compress_numel=0):
    """Wraps `optimizer` so that step() first averages each gradient over all ranks
    (gradcomm.allreduce, op="avg"), compressed with `compression`, the error-feedback
    key of each gradient being its parameter's name. `named_parameters` is
    model.named_parameters() (or a list of (name, param)); without it the names are
    "param.<group>.<index>" (the same on every rank when every rank builds the same
    optimizer). Float32 gradients with at least `min_compress_numel` elements are
    compressed, the others reduced dense. A closure passed to step() is called once,
    before the allreduce (optimizers that call it repeatedly, such as LBFGS, are not
    supported). Broadcast the initial parameters (gradcomm.broadcast) if ranks may
    start from different values."""
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"DistributedOptimizer: expected a torch.optim.Optimizer, got {type(optimizer).__name__}")
    if not isinstance(compression, str):
        raise TypeError(f"DistributedOptimizer: compression must be a spec string, got {type(compression).__name__}")
    if not isinstance(min_compress_numel, int) or min_compress_numel < 0:
        raise ValueError(f"DistributedOptimizer: min_compress_numel must be an int >= 0, got {min_compress_numel!r}")

    names = {}
    if named_parameters is None:
        for g, group in enumerate(optimizer.param_groups):
            for i, p in enumerate(group["params"]):
                names[id(p)] = f"param.{g}.{i}"
    else:
        seen = set()
        for entry in named_parameters:
            if not (isinstance(entry, tuple) and len(entry) == 2 and isinstance(entry[0], str)):
                raise TypeError("DistributedOptimizer: named_parameters must yield (name, parameter) pairs, "
                                f"got {entry!r:.80}")
            name, p = entry
            if name in seen:
                raise ValueError(f"DistributedOptimizer: parameter name '{name}' appears twice in named_parameters")
            seen.add(name)
            names.setdefault(id(p), name)
        missing = [f"group {g} index {i} (shape {tuple(p.shape)})"
                   for g, group in enumerate(optimizer.param_groups)
                   for i, p in enumerate(group["params"]) if id(p) not in names]
        if missing:
            raise ValueError(f"DistributedOptimizer: {len(missing)} optimizer parameter(s) have no name in "
                             f"named_parameters: {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}")

    base = optimizer.__class__
    methods = {k: v for k, v in _DistributedOptimizer.__dict__.items()
               if k not in ("__dict__", "__weakref__", "__qualname__")}
    methods["_gradcomm_base"] = base
    cls = type(base.__name__, (base,), methods)
    wrapped = cls(optimizer.param_groups, names, compression, min_compress_numel)
    wrapped.load_state_dict(optimizer.state_dict())  # keep any state (momentum) the optimizer already had
    return wrapped
