"""PyTorch integration: a torch.distributed backend, a DDP communication hook and a
Horovod-style optimizer.

torch.distributed backend "gradcomm" (registered when this module is imported):

    import gradcomm.torch
    dist.init_process_group("gradcomm",
                            pg_options=gradcomm.torch.ProcessGroupOptions(compression="topk:ratio=0.01"))
    ddp = DDP(model)            # no hook needed: DDP's allreduces are compressed
    gradcomm.torch.set_compression(dist.group.WORLD, "none")   # change it later

On torch 1.13 the backend is the process group; on torch >= 2 it is a c10d
Backend registered for "cpu" (and "cuda" when built with CUDA) that torch's
ProcessGroup dispatches to; backend(group) finds it either way, and
backend_available() says whether it can be used here and why not. The process
group rendezvous through torch's store (no second port) and owns its own
communicator (dist.new_group(backend="gradcomm", pg_options=...) gets another, with
its own options). Supported: all_reduce (SUM, AVG, MIN, MAX), all_gather,
all_gather_into_tensor, broadcast, reduce_scatter, reduce_scatter_tensor, barrier,
on torch 2.x the coalescing manager and the coalesced tensor ops, and the calls DDP
and FSDP make; others (reduce, gather, scatter, all_to_all, send/recv) raise an
error naming the op. All are asynchronous (async_op=True gives a Work whose
get_future() completes with the output tensors). Compression applies to all_reduce
and reduce_scatter of float32 tensors (float16/bfloat16 CPU ones as they are with the
codecs and top-k, in float32 pieces; otherwise through a float32 copy)
with SUM or AVG and at least min_compress_numel elements (default 1024, so metrics
and counters stay exact); all_gather stays exact (FSDP's parameters). An
all_reduce's error-feedback state follows the tensor's storage, so it suits tensors
reduced again and again (DDP's buckets); the state of a tensor that is freed is
dropped soon after. A reduce-scatter's follows its call site within a training step
(FSDP's gradients; see next_round()). Every rank must use the same compression.
Reductions take float32, float16, bfloat16, float64, int32, int64 and uint8;
broadcast and all_gather any dtype. stats(group) gives a group's counters.

DDP (torch.nn.parallel.DistributedDataParallel, any process group, e.g. gloo):

    state = CompressionHookState(compression="topk:ratio=0.01")
    ddp_model.register_comm_hook(state, compression_hook)

The hook starts each bucket's allreduce and returns at once; DDP overlaps the
rest of backward with it and waits on the returned future at the end.

Without DDP:

    broadcast_parameters(model.state_dict(), root_rank=0)
    opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                               model.named_parameters(), compression="qsgd:levels=16")
    broadcast_optimizer_state(opt, root_rank=0)
    loss.backward(); opt.step()

Each gradient's allreduce starts from a hook as soon as backward has produced it
(Horovod's design) and every gradient before it in a fixed order, the parameters
reversed (backward's usual order), has started: every rank issues the same
gradients in the same order, whatever order backward runs in and whichever
parameters get no gradient on some rank (those go as zeros at step()). step()
waits for them, then steps. For gradient clipping:
opt.synchronize(); clip; `with opt.skip_synchronize(): opt.step()`.

Both average like DDP (sum over ranks divided by the world size) and keep the
compression state (error feedback) under a key that names the same gradients on
every rank and in every iteration. gradcomm.init() is called on first use when the
caller has not called it (inside a torch.distributed job it uses torch's store).
"""
import atexit
import collections
import contextlib
import functools
import os
import weakref

import torch
import torch.distributed

import gradcomm

# DDP checks a hook's annotations against these exact objects.
_GradBucket = torch.distributed.GradBucket if torch.distributed.is_available() else object

__all__ = ["CompressionHookState", "compression_hook", "CompressedReduceScatter", "DistributedOptimizer",
           "broadcast_parameters",
           "broadcast_optimizer_state", "ProcessGroupOptions", "set_compression", "backend_available", "stats",
           "next_round", "backend"]

_TORCH_MAJOR = int(torch.__version__.split(".")[0])
_warned_dtypes = set()


def _dense_only(tensor, compression, min_compress_numel, who):
    # Compressors take float32, and float16/bfloat16 CPU tensors as they are for the
    # codecs and top-k (in float32 pieces, no float32 copy); other dtypes and small
    # tensors go dense, which is exact, never a silently different result. A
    # float16/bfloat16 gradient that would otherwise be compressed is said so, once per dtype.
    if compression == "none" or tensor.numel() < min_compress_numel:
        return True
    if tensor.dtype != torch.float32:
        half = tensor.dtype in (torch.float16, torch.bfloat16)
        if half and tensor.device.type == "cpu" and gradcomm._C.compresses_16bit(compression):
            return False
        if half and tensor.dtype not in _warned_dtypes:
            _warned_dtypes.add(tensor.dtype)
            import warnings
            warnings.warn(f"gradcomm {who}: {tensor.dtype} gradients are reduced dense (uncompressed): "
                          f"compression={compression!r} takes float32 here (float16/bfloat16 only on CPU, with the "
                          f"codecs and top-k). Keep the gradients in float32 to compress them, or use the "
                          f'"gradcomm" process group, which compresses {tensor.dtype} through float32.',
                          stacklevel=3)
        return True
    return False


def _check_spec(spec, who):
    """Parses a compression spec now, as the engine would at its first compressed call."""
    try:
        gradcomm._C.check_compression(spec)
    except gradcomm.Error as e:
        raise type(e)(f"{who}: compression={spec!r}: {e}") from None


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
        _check_spec(compression, "CompressionHookState")
        self.compression = compression
        self.min_compress_numel = min_compress_numel
        self.start_iter = start_iter
        self.iter = 0  # completed backward passes (counted at each iteration's last bucket)
        self.keys = set()  # the compression-state keys used so far
        self._backward = []  # this backward's Works, needed once its last bucket is issued
        # Parameter -> ordinal, assigned in the order parameters are first seen.
        # DDP calls the hook in bucket order and its buckets are the same on every
        # rank, so ordinals agree across ranks; they follow the parameter objects,
        # not bucket.index(), so a bucket's key survives DDP's bucket rebuild.
        self._ordinals = {}  # id(param) -> (weakref to param, ordinal)
        self._next_ordinal = 0
        self._counts = {"reductions": 0, "compressed_reductions": 0, "reduced_bytes": 0, "dense_ring_bytes": 0}

    def stats(self):
        """gradcomm.stats() (bytes_sent, ... of gradcomm's communicator, which only this
        hook uses in a DDP job) plus the hook's own counters: reductions (buckets),
        compressed_reductions, reduced_bytes (the buckets' bytes) and dense_ring_bytes,
        what a dense ring allreduce of them sends (2(N-1)/N of their bytes, in their own
        dtype), so saving = dense_ring_bytes / bytes_sent."""
        out = dict(gradcomm.stats()) if gradcomm.is_initialized() else {}
        out.update(self._counts)
        return out

    def _count(self, buffer, compressed):
        n = gradcomm.size()
        nbytes = buffer.numel() * buffer.element_size()
        self._counts["reductions"] += 1
        self._counts["compressed_reductions"] += int(compressed)
        self._counts["reduced_bytes"] += nbytes
        self._counts["dense_ring_bytes"] += 2 * (n - 1) * nbytes // n

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


def _complete_future(work, future):
    """Completes the hook's `future` from its gradcomm `work`, which is done by now:
    gradcomm's ordered completer (python_bindings/src/ordered_completion.h, as for the
    "gradcomm" backend's Works) calls this on one of its completion threads, in issue
    order, so the future's callbacks (which may run the hook again and wait on it) run
    one bucket after another, the same on every rank."""
    try:
        result = work._wait(-1, True)  # at once; on the program's behalf (needed() says when DDP needs it)
    except BaseException as error:  # the call's error reaches whoever waits on the future
        if isinstance(error, gradcomm.Error) and _gradcomm_torch is not None:
            # With its class in DDP's backward too (set_exception would give DDP an
            # exception object where it expects a tensor).
            _gradcomm_torch._fail_future(future, error)
        else:
            future.set_exception(error)
        return
    future.set_result(result)


def _bucket_parts(bucket, buffer):
    """The shapes of the bucket's gradients, laid end to end in its flat buffer (so
    powersgd compresses each parameter's matrix, as torch's PowerSGD hook does)."""
    parts = [tuple(g.shape) for g in bucket.gradients()]
    total = sum(g.numel() for g in bucket.gradients())
    if total != buffer.numel():
        raise RuntimeError(f"gradcomm: DDP bucket {bucket.index()} holds {buffer.numel()} elements but its "
                           f"gradients {total}; cannot tell the parameters' shapes apart")
    return parts


def compression_hook(state: CompressionHookState, bucket: _GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: averages the bucket over all ranks with gradcomm,
    compressed as `state` says. Register with
    ddp_model.register_comm_hook(state, compression_hook).

    The allreduce starts here and runs on gradcomm's engine while backward goes on;
    the returned future completes when it is done. Every rank ends with bitwise the
    same averaged gradients."""
    if not gradcomm.is_initialized():
        gradcomm.init()
    buffer = bucket.buffer()
    if state.iter < state.start_iter or _dense_only(buffer, state.compression, state.min_compress_numel,
                                                    "compression_hook"):
        state._count(buffer, compressed=False)
        work = gradcomm.allreduce_async(buffer, op="avg")
    else:
        state._count(buffer, compressed=True)
        key = state.bucket_key(bucket)
        state.keys.add(key)
        work = gradcomm.allreduce_async(buffer, op="avg", compression=state.compression, name=key,
                                        parts=_bucket_parts(bucket, buffer))
    # DDP waits on its buckets' futures once backward ends, right after its last bucket:
    # that is when it needs them (compressor=auto hides wire behind the time until
    # then); the completer's own wait, at once, does not count.
    state._backward.append(work)
    if bucket.is_last():
        state.iter += 1
        for w in state._backward:
            w.needed()
        state._backward.clear()
    future = torch.futures.Future()
    gradcomm._C.complete_in_order(work._work, functools.partial(_complete_future, work, future))
    return future


# ---- FSDP2: a compressed reduce-scatter for any process group -------------------------

_ReduceScatterBase = object
if _TORCH_MAJOR >= 2:  # FSDP2's custom-comm API (set_custom_reduce_scatter); 1.13's fsdp package
    try:               # does not even import on Python 3.11 (a dataclass error)
        from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter as _ReduceScatterBase
    except ImportError:
        pass

_live_reduce_scatters = weakref.WeakSet()


class CompressedReduceScatter(_ReduceScatterBase):
    """FSDP2's reduce-scatter, compressed by gradcomm, on any process group (gloo, NCCL):

        comm = gradcomm.torch.CompressedReduceScatter("quant:bits=8")
        for module in fsdp_modules:          # each fully_shard()-ed module
            module.set_custom_reduce_scatter(comm)

    FSDP calls it with each gradient bucket (input) and its shard (output). The bytes go
    over gradcomm's own communicator (gradcomm.init() on first use, through torch's store,
    as compression_hook does), so the group must span the job: its size and this rank's
    place in it are gradcomm's. Specs of the compressed ring's codecs (fp16, bf16, quant,
    qsgd, sign) run gradcomm's compressed reduce-scatter ((N-1)/N of the compressed
    input), and so do top-k ones (each owner gets the ranks' selected entries in its
    shard: about (N-1)/N of k entries per rank); the others (random-k, sketch, powersgd)
    and CUDA tensors a compressed allreduce of the input, whose shard is kept. Ops: AVG, SUM and PREMUL_SUM (FSDP2's set_gradient_divide_factor:
    the input is multiplied first). float32 is compressed as it is, and so are
    float16/bfloat16 CPU inputs with the codecs and top-k (in float32 pieces of ~1M
    elements, never a float32 copy of the bucket); others go through a float32 copy.
    Tensors below min_compress_numel, and other ops, are exact.

    Error feedback: the j-th reduce-scatter of a size and dtype within a training step is
    the same FSDP parameter group on every rank and in every step, so its residual is
    keyed so ("fsdp-rs/<numel>/<dtype>#<j>"); a step ends at each torch.optim
    optimizer's step() (call next_round() yourself without one). stats() counts what it
    reduced against what a dense reduce-scatter sends."""

    def __init__(self, compression="quant:bits=8", min_compress_numel=1024):
        if not isinstance(compression, str):
            raise TypeError(f"CompressedReduceScatter: compression must be a spec string, got "
                            f"{type(compression).__name__}")
        if not isinstance(min_compress_numel, int) or min_compress_numel < 0:
            raise ValueError(f"CompressedReduceScatter: min_compress_numel must be an int >= 0, got "
                             f"{min_compress_numel!r}")
        _check_spec(compression, "CompressedReduceScatter")
        self.compression = compression
        self.min_compress_numel = min_compress_numel
        self._library_reduce_scatter = compression != "none" and gradcomm._C.reduce_scatter_compresses(compression)
        # ... and takes a float16/bfloat16 CPU input as it is (in float32 pieces)
        self._library_16bit = compression != "none" and gradcomm._C.compresses_16bit(compression)
        self._round_calls = collections.Counter()
        self._stats = {"reductions": 0, "compressed_reductions": 0, "reduced_bytes": 0,
                       "dense_reduce_scatter_bytes": 0}
        _live_reduce_scatters.add(self)

    def allocate(self, size, *, dtype, device):
        return torch.empty(size, dtype=dtype, device=device)

    def next_round(self):
        """Ends a training step's round of calls (every torch.optim step() does it)."""
        self._round_calls.clear()

    def stats(self):
        """reductions, compressed_reductions, reduced_bytes (the inputs' bytes) and
        dense_reduce_scatter_bytes ((N-1)/N of them: what a dense reduce-scatter sends);
        gradcomm.stats() has the bytes gradcomm really sent."""
        return dict(self._stats)

    def __call__(self, output_tensor, input_tensor, group=None, op=None, async_op=False):
        who = "CompressedReduceScatter"
        if not gradcomm.is_initialized():
            gradcomm.init()
        n = gradcomm.size()
        group_size = torch.distributed.get_world_size(group)
        group_rank = torch.distributed.get_rank(group)
        if group_size != n or group_rank != gradcomm.rank():
            raise ValueError(f"{who}: the group has {group_size} ranks (this one {group_rank}), gradcomm's "
                             f"communicator {n} (this one {gradcomm.rank()}): it reduces over gradcomm's job, so "
                             f"the group must be the whole job (FSDP over all ranks; not HSDP's shard groups)")
        if input_tensor.numel() != n * output_tensor.numel():
            raise ValueError(f"{who}: the input has {input_tensor.numel()} elements, expected {n} x "
                             f"{output_tensor.numel()} (the output's)")
        if input_tensor.dtype != output_tensor.dtype or input_tensor.device != output_tensor.device:
            raise ValueError(f"{who}: the input is {input_tensor.dtype} on {input_tensor.device}, the output "
                             f"{output_tensor.dtype} on {output_tensor.device}")
        reduce_op, factor = _fsdp_reduce_op(op, who)
        exact = (self.compression == "none" or reduce_op not in ("sum", "avg") or
                 input_tensor.numel() < self.min_compress_numel or
                 input_tensor.dtype not in (torch.float32, torch.float16, torch.bfloat16))
        flat = input_tensor.reshape(-1)
        as_is = self._library_reduce_scatter and self._library_16bit and flat.device.type == "cpu"
        if not exact and flat.dtype != torch.float32 and not as_is:
            flat = flat.to(torch.float32)  # these compressors (or this device) take float32
        elif factor is not None or not flat.is_contiguous():
            flat = flat.clone(memory_format=torch.contiguous_format)  # the caller's input stays
        if factor is not None:
            flat.mul_(factor)
        bytes_in = input_tensor.numel() * input_tensor.element_size()
        self._stats["reductions"] += 1
        self._stats["reduced_bytes"] += bytes_in
        self._stats["dense_reduce_scatter_bytes"] += (n - 1) * bytes_in // n
        m = output_tensor.numel()
        if exact:
            share = gradcomm.reduce_scatter(flat, op=reduce_op)
        else:
            self._stats["compressed_reductions"] += 1
            site = f"{flat.numel()}/{str(input_tensor.dtype).replace('torch.', '')}"
            key = f"fsdp-rs/{site}#{self._round_calls[site]}"
            self._round_calls[site] += 1
            if self._library_reduce_scatter and flat.device.type == "cpu":
                share = gradcomm.reduce_scatter(flat, op=reduce_op, compression=self.compression, name=key)
            else:
                gradcomm.allreduce(flat, op=reduce_op, compression=self.compression, name=key)
                share = flat.narrow(0, gradcomm.rank() * m, m)
        output_tensor.copy_(share.reshape(output_tensor.shape))
        if not async_op:
            return None
        future = torch.futures.Future()
        future.set_result([output_tensor])
        return torch._C._distributed_c10d._create_work_from_future(future)


def _fsdp_reduce_op(op, who):
    """(gradcomm op name, premultiplier or None) for a torch ReduceOp FSDP passes."""
    ReduceOp = torch.distributed.ReduceOp
    kind = getattr(op, "op", op) if op is not None else ReduceOp.SUM
    if kind == ReduceOp.PREMUL_SUM:
        factor = op.factor
        if torch.is_tensor(factor):
            factor = float(factor.reshape(-1)[0])
        return "sum", float(factor)
    names = {ReduceOp.SUM: "sum", ReduceOp.AVG: "avg", ReduceOp.MIN: "min", ReduceOp.MAX: "max"}
    if kind not in names:
        raise NotImplementedError(f"{who}: reduce op {kind} is not supported; supported: SUM, AVG, MIN, MAX, "
                                  f"PREMUL_SUM")
    return names[kind], None


class _DistributedOptimizer(torch.optim.Optimizer):
    """Methods mixed into a subclass of the wrapped optimizer's class (see
    DistributedOptimizer): isinstance(opt, torch.optim.SGD) stays true, so LR
    schedulers and checkpoints work as before."""

    def __init__(self, params, names, compression, min_compress_numel):
        self._gradcomm_base.__init__(self, params)
        self._gradcomm_names = names  # id(param) -> name
        self._gradcomm_compression = compression
        self._gradcomm_min_compress_numel = min_compress_numel
        # The order in which every rank issues the gradients: the parameters reversed,
        # the order backward usually produces them in (DDP's first buckets assume the
        # same). Issuing in the order the hooks fire instead would let ranks pair
        # different gradients: a parameter without a gradient on one rank only is
        # issued there at synchronize(), after the others.
        self._gradcomm_order = [p for group in reversed(self.param_groups) for p in reversed(group["params"])
                                if p.requires_grad]
        self._gradcomm_ready = set()  # parameters whose gradient of this backward is in
        self._gradcomm_next = 0  # _gradcomm_order[:_gradcomm_next] are issued
        self._gradcomm_works = {}  # param -> (Work, grad, reduced tensor), in issue order
        self._gradcomm_synchronized = False
        self._gradcomm_should_synchronize = True
        self._gradcomm_grad_accs = []  # the hooked AccumulateGrad nodes, kept alive
        for p in self._gradcomm_order:
            self._gradcomm_hook(p)

    def _gradcomm_hook(self, p):
        # AccumulateGrad's hook runs once p.grad holds this backward's gradient
        # (torch 1.13 has no post-accumulate hook on the tensor itself).
        accumulator = p.expand_as(p).grad_fn.next_functions[0][0]
        ref = weakref.ref(p)

        def ready(*_):
            param = ref()
            if param is None:
                return
            if param in self._gradcomm_ready:
                raise RuntimeError(f"DistributedOptimizer: parameter '{self._gradcomm_names[id(param)]}' received a "
                                   "second gradient before step(): call step() (or synchronize()) after every "
                                   "backward")
            self._gradcomm_ready.add(param)
            self._gradcomm_issue(lambda p: p in self._gradcomm_ready)

        accumulator.register_hook(ready)
        self._gradcomm_grad_accs.append(accumulator)

    def _gradcomm_issue(self, may_issue):
        """Issues the parameters of _gradcomm_order from the first one not issued yet,
        while may_issue(param) holds: a gradient that is in before an earlier one
        waits for it, so every rank issues the same sequence."""
        order = self._gradcomm_order
        while self._gradcomm_next < len(order) and may_issue(order[self._gradcomm_next]):
            p = order[self._gradcomm_next]
            self._gradcomm_next += 1
            if p.requires_grad:  # a parameter frozen since is skipped, on every rank alike
                self._gradcomm_works[p] = self._gradcomm_start(p)

    def _gradcomm_start(self, p):
        """Starts the average of p.grad over all ranks (a missing gradient as zeros);
        returns (work, grad, tensor reduced)."""
        if not gradcomm.is_initialized():
            gradcomm.init()
        if p.grad is None:
            p.grad = torch.zeros_like(p, memory_format=torch.contiguous_format)
        grad = p.grad
        name = self._gradcomm_names[id(p)]
        if grad.is_sparse:
            raise TypeError(f"DistributedOptimizer: parameter '{name}' has a sparse gradient; gradcomm reduces dense "
                            "gradients only")
        reduced = grad if grad.is_contiguous() else grad.contiguous()
        if _dense_only(reduced, self._gradcomm_compression, self._gradcomm_min_compress_numel,
                       "DistributedOptimizer"):
            work = gradcomm.allreduce_async(reduced, op="avg")
        else:
            work = gradcomm.allreduce_async(reduced, op="avg", compression=self._gradcomm_compression, name=name)
        return work, grad, reduced

    def synchronize(self):
        """Waits until every gradient is averaged over all ranks (in place). The
        parameters not issued yet (no gradient on this rank, one set by hand, or one
        waiting for an earlier parameter's) are issued here, in the same order as
        from the hooks, a missing gradient as zeros, so every rank makes the same
        calls in the same order."""
        self._gradcomm_issue(lambda p: True)
        works, self._gradcomm_works = self._gradcomm_works, {}
        self._gradcomm_ready, self._gradcomm_next = set(), 0
        for work, grad, reduced in works.values():
            work.wait()
            if reduced is not grad:
                grad.copy_(reduced)
        self._gradcomm_synchronized = True

    @contextlib.contextmanager
    def skip_synchronize(self):
        """step() inside this block does not synchronize: for a synchronize() the
        caller made already (then clipped or inspected the averaged gradients)."""
        self._gradcomm_should_synchronize = False
        try:
            yield
        finally:
            self._gradcomm_should_synchronize = True

    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self._gradcomm_should_synchronize:
            self.synchronize()
        elif not self._gradcomm_synchronized:
            raise RuntimeError("DistributedOptimizer: step() inside skip_synchronize() needs a synchronize() first "
                               "(the gradients are not averaged yet)")
        self._gradcomm_synchronized = False
        self._gradcomm_base.step(self)
        return loss

    def zero_grad(self, set_to_none=False):
        if self._gradcomm_ready or self._gradcomm_works:
            raise RuntimeError("DistributedOptimizer: zero_grad() while gradients are being averaged (between "
                               "backward and step()); call it before backward or after step()")
        return self._gradcomm_base.zero_grad(self, set_to_none=set_to_none)


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
    _check_spec(compression, "DistributedOptimizer")

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


def broadcast_parameters(params, root_rank=0):
    """Copies rank `root_rank`'s tensors into every rank's, in place: a state_dict
    (model.state_dict(); its entries sorted by name), named_parameters() pairs, or
    tensors. Every rank must pass the same names, shapes and dtypes."""
    if isinstance(params, dict):
        tensors = [t for _, t in sorted(params.items())]
    else:
        tensors = [p[1] if isinstance(p, tuple) else p for p in params]
    if not gradcomm.is_initialized():
        gradcomm.init()
    works = []
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"broadcast_parameters: expected tensors, got {type(t).__name__}")
        works.append(gradcomm.broadcast_async(t.data if t.is_contiguous() else t.data.contiguous(), root=root_rank))
    for t, work in zip(tensors, works):
        result = work.wait()
        if result.data_ptr() != t.data.data_ptr():
            t.data.copy_(result)


def broadcast_optimizer_state(optimizer, root_rank=0):
    """Gives every rank rank `root_rank`'s optimizer state (momentum buffers, step
    counts, hyper-parameters), e.g. after it alone loaded a checkpoint. Every rank's
    optimizer must hold the same parameter groups. The state travels as JSON plus
    raw tensor bytes (_pack_state): nothing received is unpickled."""
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"broadcast_optimizer_state: expected a torch.optim.Optimizer, got {type(optimizer).__name__}")
    if not gradcomm.is_initialized():
        gradcomm.init()
    root = gradcomm.rank() == root_rank
    payload = _pack_state(optimizer.state_dict()) if root else b""
    length = torch.tensor([len(payload)], dtype=torch.int64)
    gradcomm.broadcast(length, root=root_rank)
    data = torch.frombuffer(bytearray(payload), dtype=torch.uint8) if root else torch.empty(int(length[0]),
                                                                                             dtype=torch.uint8)
    gradcomm.broadcast(data, root=root_rank)
    if not root:
        optimizer.load_state_dict(_unpack_state(data.numpy().tobytes()))


# Optimizer state as bytes without pickle: a JSON description (dicts as key/value
# pairs, so int keys stay ints; tensors as references) followed by the tensors' bytes.
_DTYPES = {str(d): d for d in (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64,
                               torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool)}


def _pack_state(state):
    import json
    blobs = []

    def encode(v):
        if isinstance(v, torch.Tensor):
            t = v.detach().cpu().contiguous()
            if str(t.dtype) not in _DTYPES:
                raise TypeError(f"broadcast_optimizer_state: tensors of {t.dtype} are not supported")
            blobs.append(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
            return {"t": len(blobs) - 1, "dtype": str(t.dtype), "shape": list(t.shape)}
        if isinstance(v, dict):
            return {"d": [[encode(k), encode(x)] for k, x in v.items()]}
        if isinstance(v, (list, tuple)):
            return {"l" if isinstance(v, list) else "u": [encode(x) for x in v]}
        if v is None or isinstance(v, (bool, int, float, str)):
            return {"v": v}
        raise TypeError(f"broadcast_optimizer_state: cannot send a {type(v).__name__} in the optimizer state")

    header = json.dumps(encode(state)).encode()
    sizes = json.dumps([len(b) for b in blobs]).encode()
    return (len(header).to_bytes(8, "little") + header + len(sizes).to_bytes(8, "little") + sizes + b"".join(blobs))


def _unpack_state(data):
    import json
    at = 8 + int.from_bytes(data[:8], "little")
    header = json.loads(data[8:at])
    n = int.from_bytes(data[at:at + 8], "little")
    sizes = json.loads(data[at + 8:at + 8 + n])
    offsets, position = [], at + 8 + n
    for size in sizes:
        offsets.append(position)
        position += size

    def decode(e):
        if "t" in e:
            i, dtype = e["t"], _DTYPES[e["dtype"]]
            raw = bytearray(data[offsets[i]:offsets[i] + sizes[i]])
            flat = torch.frombuffer(raw, dtype=dtype) if raw else torch.empty(0, dtype=dtype)
            return flat.reshape(e["shape"]).clone()
        if "d" in e:
            return {decode(k): decode(v) for k, v in e["d"]}
        if "l" in e:
            return [decode(x) for x in e["l"]]
        if "u" in e:
            return tuple(decode(x) for x in e["u"])
        return e["v"]

    return decode(header)


# ---- the torch.distributed backend ---------------------------------------------------

def _backend_build_record():
    """The build's record of the backend (python_bindings/torch_backend/CMakeLists.txt):
    "ON (torch <version> at <dir>)" or "OFF (<why>)"."""
    try:
        with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "_torch_backend_status.txt")) as f:
            return f.read().strip()
    except OSError:
        return "unknown (no build record)"


def _backend_built_for():
    """The torch version the backend was built against, or None when the record does not say."""
    built = _backend_build_record()
    if built.startswith("ON (torch ") and " at " in built:
        return built[len("ON (torch "):built.index(" at ")]
    return None


# The module links against one torch's C++ ABI: loaded into another torch it does not fail
# an import, it aborts the interpreter (std::system_error out of a static initializer). So
# it is loaded only into the torch it was built for; otherwise the backend is unavailable
# with an ImportError naming both versions, and gradcomm.torch's hook still works.
_backend_import_error = None
_gradcomm_torch = None
if _backend_built_for() not in (None, torch.__version__):
    _backend_import_error = ImportError(
        f"gradcomm's torch backend was built for torch {_backend_built_for()}, but this interpreter runs torch "
        f"{torch.__version__}; loading it would abort the process. Reinstall gradcomm with this torch "
        f"(pip install . under this interpreter), or use the DDP communication hook (gradcomm.torch.compression_hook), which needs no backend")
else:
    try:  # built only for a torch it supports (python_bindings/torch_backend/CMakeLists.txt)
        from . import _gradcomm_torch
    except ImportError as e:
        _backend_import_error = e


class BackendAvailability:
    """What backend_available() returns: true when the "gradcomm" torch.distributed
    backend can be used in this interpreter; `reason` says why not (or what it was
    built against)."""

    def __init__(self, available, reason):
        self.available = available
        self.reason = reason

    def __bool__(self):
        return self.available

    def __repr__(self):
        return f"BackendAvailability(available={self.available}, reason={self.reason!r})"

    __str__ = __repr__


def backend_available():
    """Whether init_process_group("gradcomm") can work here, and why not: the build
    skips the backend when it cannot build against the interpreter's torch (the
    reason is recorded at build time), and a module built for another torch does not
    load."""
    built = _backend_build_record()
    if _gradcomm_torch is not None:
        return BackendAvailability(True, f"built: {built}; running torch {torch.__version__}")
    if not torch.distributed.is_available():
        return BackendAvailability(False, f"this torch ({torch.__version__}) has no torch.distributed")
    if built.startswith("OFF"):
        why = built[len("OFF ("):-1] if built.startswith("OFF (") and built.endswith(")") else built
        return BackendAvailability(False, f"not built: {why}")
    if _backend_built_for() not in (None, torch.__version__):
        return BackendAvailability(False, str(_backend_import_error))
    return BackendAvailability(False, f"built ({built}) but it does not load with torch {torch.__version__}: "
                                      f"{_backend_import_error}; reinstall gradcomm against this torch")


# Below this many elements a gradcomm process group reduces exactly whatever its
# compression: gradients are large, metrics and counters small.
PG_MIN_COMPRESS_NUMEL = 1024


class ProcessGroupOptions:
    """Options of a "gradcomm" process group, given as init_process_group(...,
    pg_options=...) or new_group(..., pg_options=...).

    compression: gradcomm spec string ("none", "topk:ratio=0.01", "qsgd:levels=16", ...)
        used by all_reduce of float32 tensors with SUM or AVG.
    min_compress_numel: tensors with fewer elements are reduced exactly (default
        1024: a process group also carries metrics, counters and flags, which a
        lossy compressor must not touch; 0 compresses every float32 sum).
    """

    def __init__(self, compression="none", min_compress_numel=PG_MIN_COMPRESS_NUMEL):
        if not isinstance(compression, str):
            raise TypeError(f"ProcessGroupOptions: compression must be a spec string, got {type(compression).__name__}")
        if not isinstance(min_compress_numel, int) or min_compress_numel < 0:
            raise ValueError(f"ProcessGroupOptions: min_compress_numel must be an int >= 0, got {min_compress_numel!r}")
        self.compression = compression
        self.min_compress_numel = min_compress_numel

    def __repr__(self):
        return f"ProcessGroupOptions(compression={self.compression!r}, min_compress_numel={self.min_compress_numel})"


def _require_backend():
    if _gradcomm_torch is None:
        raise ImportError(f"gradcomm: the torch.distributed backend is not available: {backend_available().reason}")


def _create_process_group(backend_options, pg_options):
    # The extended creator API (torch 1.13 and 2.x alike): c10d::DistributedBackendOptions,
    # then what the caller gave as pg_options (2.x calls it backend_options).
    _require_backend()
    if pg_options is None:
        pg_options = ProcessGroupOptions()
    if not isinstance(pg_options, ProcessGroupOptions):
        raise TypeError("gradcomm backend: pg_options must be a gradcomm.torch.ProcessGroupOptions, got "
                        f"{type(pg_options).__name__}")
    _check_spec(pg_options.compression, "ProcessGroupOptions")
    # torch 1.13: this is the process group; torch >= 2: the backend that torch's
    # ProcessGroup dispatches to for the devices registered below.
    pg = _gradcomm_torch.ProcessGroupGradcomm(
        backend_options.store, backend_options.group_rank, backend_options.group_size, backend_options.timeout,
        str(backend_options.group_id), pg_options.compression, pg_options.min_compress_numel)
    _live_groups.add(pg)
    return pg


# The gradcomm process groups still alive, shut down at interpreter exit: torch keeps
# its groups referenced to the end, and a communicator's engine thread must not
# run on into process teardown (gradcomm.shutdown() does the same for gradcomm.init()).
_live_groups = weakref.WeakSet()


@atexit.register
def _shutdown_groups():
    for pg in list(_live_groups):
        pg._shutdown()


def _backend_of(group, who):
    """The gradcomm backend object of `group` (None: the default group): the group
    itself on torch 1.13, the backend its ProcessGroup dispatches CPU tensors to on
    torch >= 2."""
    _require_backend()
    if group is None:
        group = torch.distributed.group.WORLD
        if group is None:
            raise RuntimeError(f"{who}: no default process group; call dist.init_process_group(\"gradcomm\") first")
    if isinstance(group, _gradcomm_torch.ProcessGroupGradcomm):
        return group
    if _TORCH_MAJOR >= 2 and isinstance(group, torch.distributed.ProcessGroup):
        try:
            backend = group._get_backend(torch.device("cpu"))
        except RuntimeError:
            backend = None
        if isinstance(backend, _gradcomm_torch.ProcessGroupGradcomm):
            return backend
        name = torch.distributed.get_backend(group)
        raise TypeError(f"{who}: expected a process group of the \"gradcomm\" backend, got one of \"{name}\"")
    raise TypeError(f"{who}: expected a gradcomm process group, got {type(group).__name__}")


def backend(group=None):
    """The gradcomm backend object of a "gradcomm" process group (None: the default
    group): on torch 1.13 the group itself, on torch >= 2 the c10d Backend its
    ProcessGroup dispatches to. It has .compression and .min_compress_numel."""
    return _backend_of(group, "gradcomm.torch.backend")


def set_compression(group, compression, min_compress_numel=PG_MIN_COMPRESS_NUMEL):
    """Sets the compression of a "gradcomm" process group (dist.group.WORLD, None for
    it, or a new_group's) for the collectives issued after it; every rank must set
    the same."""
    _backend_of(group, "set_compression").set_compression(compression, min_compress_numel)


def stats(group=None):
    """Counters of a "gradcomm" process group (None: the default group): bytes_sent
    and bytes_received on the wire (headers included), ops completed, the time
    split (total_s = reduce_s + encode_s + decode_s + comm_s; engine_cpu_s), and
    for the reductions issued (all_reduce, reduce_scatter and their coalesced forms):
    reductions, compressed_reductions, reduced_bytes and dense_ring_bytes, what a
    dense ring would have sent for them (2(N-1)/N x their bytes for an all_reduce,
    (N-1)/N for a reduce_scatter); gathered_bytes, the
    payload the all-gathers send (exact: (N-1) x input bytes each), so that
    bytes_sent - gathered_bytes is about what the reductions sent. gradcomm.stats()
    covers gradcomm.init()'s communicator only; each process group has its own."""
    return _backend_of(group, "gradcomm.torch.stats")._stats()


def next_round(group=None):
    """Ends a round of reduce-scatter calls on a "gradcomm" process group (None: the
    default group). The error-feedback state of a compressed reduce-scatter (FSDP's
    gradients) is keyed by its place in the round: the j-th reduce-scatter of its
    size since the round began. Every torch.optim optimizer's step() ends the round
    on every live gradcomm group by itself; call this once per training step, at the
    same point on every rank, only when no torch.optim optimizer steps."""
    _backend_of(group, "next_round")._next_round()


def _end_rounds(*args, **kwargs):
    for pg in list(_live_groups):
        pg._next_round()
    for comm in list(_live_reduce_scatters):
        comm.next_round()


# torch >= 2.0 (1.13's optimizers have no global hooks).
try:
    from torch.optim.optimizer import register_optimizer_step_pre_hook as _register_step_hook
except ImportError:
    _register_step_hook = None
if _register_step_hook is not None:
    _register_step_hook(_end_rounds)


def _register_backend():
    if not torch.distributed.is_available() or "GRADCOMM" in torch.distributed.Backend._plugins:
        return
    if _TORCH_MAJOR >= 2:
        devices = ["cpu"] + (["cuda"] if _gradcomm_torch is not None and _gradcomm_torch.built_with_cuda else [])
        torch.distributed.Backend.register_backend("gradcomm", _create_process_group, extended_api=True,
                                                   devices=devices)
    else:
        torch.distributed.Backend.register_backend("gradcomm", _create_process_group, extended_api=True)


_register_backend()
