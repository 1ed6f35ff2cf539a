#!/usr/bin/python3
"""One rank of PyTorch DDP training, timed step by step (bench/e2e/run.sh starts one per
network namespace; see bench/e2e/README.md).

Model: MLP 784-2048-2048-10 (ReLU, 5,824,522 parameters), batch 64 per rank, SGD with
momentum, Fashion-MNIST (rank r trains on examples r, r+N, ...). torch.distributed's gloo
process group from the environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; the harness
sets GLOO_SOCKET_IFNAME=eth0), one thread per rank.

    ddp_step.py VARIANT [--warmup W] [--steps S] [--out FILE] [--profile] [--grads keep|free] [--eval N]

VARIANT:
  gloo             DDP, no hook (gloo allreduce)
  fp16             DDP + torch's fp16_compress_hook
  powersgd         DDP + torch's powerSGD_hook, rank 4, one bucket (powersgd:buckets=one|cap|default:
                   see --powersgd-buckets)
  gradcomm:SPEC    DDP + gradcomm.torch.compression_hook(CompressionHookState(compression=SPEC))
  compute          forward, backward, step, no communication (the compute-alone floor; a barrier
                   outside the timed region aligns the ranks' steps)

A step is timed from the forward pass through optimizer.step() (wall clock; zero_grad
first, in place unless --grads free). W warm-up steps, then a barrier, then S timed steps;
every rank's per-step times are gathered through the gloo group and rank 0 writes one JSON
record: per step the max over ranks (`step_s`), its median and p90, each rank's own median,
bytes each rank sent on eth0 per step (/proc/net/dev, every variant), gradcomm.stats()
deltas per step (gradcomm variants), minor page faults, involuntary context switches and CPU
time (all threads) per step, DDP's bucket sizes, and the loss. --profile adds, for gradcomm
variants, one entry per hook call: bucket, elements, entry time, wall time, the part inside
the C++ collective (stats total_s delta) and its split (meaningful while the hook blocks; a
hook returning an incomplete future is timed only up to its return).
"""
import argparse
import faulthandler
import functools
import gc
import gzip
import json
import os
import resource
import sys
import time
import traceback
import weakref

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn

DATA_DIR = "/usr/share/datasets/fashion-mnist"
HIDDEN = (2048, 2048)
STAT_KEYS = ("bytes_sent", "bytes_received", "ops", "total_s", "reduce_s", "encode_s", "decode_s", "comm_s",
             "engine_cpu_s")


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("variant", help="gloo | fp16 | powersgd | gradcomm:SPEC | backend:SPEC | compute")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps first (default 5)")
    p.add_argument("--steps", type=int, default=30, help="timed steps (default 30)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--data", default=os.environ.get("GRADCOMM_E2E_DATA", DATA_DIR))
    p.add_argument("--powersgd-buckets", choices=("one", "cap", "default"), default="one",
                   help="one: one bucket (default); cap: bucket_cap_mb=1024 only (still 2 buckets after "
                        "DDP's rebuild); default: DDP's default buckets")
    p.add_argument("--powersgd-start", type=int, default=2,
                   help="start_powerSGD_iter (>= 2 with error feedback; warm-up steps should cover it)")
    p.add_argument("--grads", choices=("keep", "free"), default="keep",
                   help="between steps, zero the gradients in place (keep; default) or free them "
                        "(zero_grad(set_to_none=True): the allocator then returns and refaults them)")
    p.add_argument("--profile", action="store_true", help="per hook call timings (gradcomm variants)")
    p.add_argument("--eval", type=int, default=0, metavar="N",
                   help="after the last step, rank 0 records the test accuracy on the first N test examples")
    p.add_argument("--powersgd-rank", type=int, default=4, help="torch's PowerSGD matrix_approximation_rank")
    p.add_argument("--out", help="write rank 0's JSON record here (default: stdout)")
    a = p.parse_args(argv)
    if a.variant.startswith("powersgd:buckets="):  # the variant names the bucket layout
        a.powersgd_buckets = a.variant.split("=", 1)[1]
        if a.powersgd_buckets not in ("one", "cap", "default"):
            p.error(f"'{a.variant}': buckets must be one, cap or default")
    elif a.variant not in ("gloo", "fp16", "powersgd", "compute") and not a.variant.startswith(("gradcomm:", "backend:")):
        p.error(f"unknown variant '{a.variant}'")
    if a.steps < 1 or a.warmup < 0:
        p.error("--steps must be >= 1 and --warmup >= 0")
    return a


# ---- data --------------------------------------------------------------------------------
def read_idx(path, magic):
    """An idx file (gzip): big-endian magic, dims, then uint8 data."""
    with gzip.open(path, "rb") as f:
        raw = f.read()
    got = int.from_bytes(raw[0:4], "big")
    if got != magic:
        raise SystemExit(f"ddp_step: {path}: idx magic {got}, expected {magic}")
    ndim = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def load_shard(data_dir, rank, world):
    images = os.path.join(data_dir, "train-images-idx3-ubyte.gz")
    labels = os.path.join(data_dir, "train-labels-idx1-ubyte.gz")
    for f in (images, labels):
        if not os.path.isfile(f):
            raise SystemExit(f"ddp_step: Fashion-MNIST not found: no {f} (Debian: apt-get install "
                             f"dataset-fashion-mnist, or --data DIR / GRADCOMM_E2E_DATA with the *-ubyte.gz files)")
    x = read_idx(images, 2051)[rank::world]
    y = read_idx(labels, 2049)[rank::world]
    return x, y


def load_test(data_dir, count):
    x = read_idx(os.path.join(data_dir, "t10k-images-idx3-ubyte.gz"), 2051)[:count]
    y = read_idx(os.path.join(data_dir, "t10k-labels-idx1-ubyte.gz"), 2049)[:count]
    return (torch.from_numpy((x.reshape(len(x), -1).astype(np.float32) / 255.0 - 0.2860) / 0.3530),
            torch.from_numpy(y.astype(np.int64)))


def test_accuracy(model, data_dir, count):
    """Fraction of the first `count` test examples the model classifies correctly."""
    x, y = load_test(data_dir, count)
    correct = 0
    with torch.no_grad():
        for i in range(0, len(x), 1000):
            correct += int((model(x[i:i + 1000]).argmax(dim=1) == y[i:i + 1000]).sum())
    return correct / len(x)


def batches(x, y, batch_size, count):
    """`count` batches in order (wrapping around the shard), converted before timing starts."""
    out, pos = [], 0
    for _ in range(count):
        idx = np.arange(pos, pos + batch_size) % len(x)
        pos += batch_size
        xb = torch.from_numpy((x[idx].reshape(batch_size, -1).astype(np.float32) / 255.0 - 0.2860) / 0.3530)
        out.append((xb, torch.from_numpy(y[idx].astype(np.int64))))
    return out


# ---- per-step counters ---------------------------------------------------------------------
def eth0_tx_bytes():
    """Bytes this namespace's eth0 has sent (/proc/net/dev is per network namespace)."""
    try:
        with open("/proc/net/dev") as f:
            for line in f:
                name, _, rest = line.partition(":")
                if name.strip() == "eth0":
                    return int(rest.split()[8])
    except OSError:
        pass
    return None


def usage():
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_minflt, ru.ru_nivcsw, ru.ru_utime + ru.ru_stime


def gradcomm_stats(gradcomm):
    if gradcomm is None:
        return None
    s = gradcomm.stats()
    return {k: s[k] for k in STAT_KEYS}


def delta(a, b):
    return None if a is None or b is None else {k: b[k] - a[k] for k in a}


# ---- the variants -----------------------------------------------------------------------------
class HookProfile:
    """Times a gradcomm hook call by call (the loop sets `step`); see the module docstring."""

    def __init__(self, gradcomm):
        self.gradcomm, self.step, self.calls = gradcomm, -1, []

    def wrap(self, hook):
        # DDP checks the hook's name and annotations: functools.wraps keeps them.
        @functools.wraps(hook)
        def profiled(state, bucket):
            s0 = gradcomm_stats(self.gradcomm)
            # time.time() (CLOCK_REALTIME) is one clock for every rank of the emulated
            # cluster: entries compare across ranks (the wait for the last rank to arrive).
            enter = time.time()
            t0 = time.perf_counter()
            fut = hook(state, bucket)
            wall = time.perf_counter() - t0
            d = delta(s0, gradcomm_stats(self.gradcomm))
            self.calls.append({"step": self.step, "bucket": bucket.index(), "numel": bucket.buffer().numel(),
                               "params": len(bucket.parameters()), "last": bucket.is_last(), "enter": enter,
                               "wall_s": wall, "cxx_s": d["total_s"], "encode_s": d["encode_s"],
                               "decode_s": d["decode_s"], "reduce_s": d["reduce_s"], "comm_s": d["comm_s"],
                               "bytes_sent": d["bytes_sent"], "completed": fut.done()})
            return fut
        return profiled


def setup(args, model):
    """Wraps the model for the variant; returns (model, gradcomm module or None, profile, notes)."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    v, notes = args.variant, {}
    if v == "compute":
        return model, None, None, notes
    if v.startswith("powersgd"):
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
        # With more than one bucket, powerSGD_hook over gloo issues collectives from future
        # callbacks (gloo's threads) while the next bucket's hook issues its own from the
        # autograd thread: ranks can order them differently, and gloo aborts or hangs (README,
        # "PowerSGD and DDP's buckets"). One bucket needs a large bucket_cap_mb *and* a large
        # first bucket: DDP's rebuild after iteration 0 caps the first one at
        # dist._DEFAULT_FIRST_BUCKET_BYTES (1 MiB), whatever bucket_cap_mb says.
        kw = {}
        if args.powersgd_buckets in ("one", "cap"):
            kw["bucket_cap_mb"] = 1024
        if args.powersgd_buckets == "one":
            dist._DEFAULT_FIRST_BUCKET_BYTES = 1024 * 2**20  # read by DDP's constructor
        ddp = DDP(model, **kw)
        state = psgd.PowerSGDState(process_group=None, matrix_approximation_rank=args.powersgd_rank,
                                   start_powerSGD_iter=args.powersgd_start)
        ddp.register_comm_hook(state, psgd.powerSGD_hook)
        notes.update(powersgd_buckets=args.powersgd_buckets, matrix_approximation_rank=args.powersgd_rank,
                     start_powerSGD_iter=args.powersgd_start)
        return ddp, None, None, notes
    ddp = DDP(model)
    if v == "fp16":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
        return ddp, None, None, notes
    if v == "gloo" or v.startswith("backend:"):  # backend: the process group compresses, no hook
        return ddp, None, None, notes
    # gradcomm:SPEC. Imported only now, with torch.distributed initialized, so that
    # gradcomm.init() rendezvouses through torch's store.
    import gradcomm
    from gradcomm.torch import CompressionHookState, compression_hook
    gradcomm.init()
    hook, profile = compression_hook, None
    if args.profile:
        profile = HookProfile(gradcomm)
        hook = profile.wrap(compression_hook)
    ddp.register_comm_hook(CompressionHookState(compression=v.split(":", 1)[1]), hook)
    notes["gradcomm_version"] = getattr(gradcomm, "__version__", None)
    return ddp, gradcomm, profile, notes


def bucket_sizes(model):
    """DDP's bucket sizes in bytes: after its rebuild (at the end of the first iteration)
    where it happened, else the initial ones; from DDP's logging data."""
    try:
        data = model._get_ddp_logging_data()
    except Exception:  # not DDP, or a torch without it
        return None
    sizes = data.get("rebuilt_bucket_sizes") or data.get("bucket_sizes")
    if isinstance(sizes, str):
        sizes = [int(s) for s in sizes.split(",") if s.strip()]
    return sizes


# ---- the loop ---------------------------------------------------------------------------------
def main(argv):
    args = parse_args(argv)
    hang_dump_s = float(os.environ.get("GRADCOMM_E2E_HANG_DUMP_S", "0"))
    if hang_dump_s > 0:  # the harness kills a run at its deadline: say where it was first
        faulthandler.dump_traceback_later(hang_dump_s, exit=False)
    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    x, y = load_shard(args.data, rank, world)
    data = batches(x, y, args.batch_size, args.warmup + args.steps)
    if args.variant.startswith("backend:"):
        # DDP on gradcomm's torch.distributed backend: no hook; the process group
        # compresses DDP's bucket allreduces itself.
        import gradcomm.torch as gtorch
        dist.init_process_group("gradcomm", rank=rank, world_size=world,
                                pg_options=gtorch.ProcessGroupOptions(compression=args.variant.split(":", 1)[1]))
    else:
        dist.init_process_group("gloo", rank=rank, world_size=world)

    torch.manual_seed(args.seed)
    layers, width = [], 784
    for h in HIDDEN:
        layers += [nn.Linear(width, h), nn.ReLU()]
        width = h
    model = nn.Sequential(*layers, nn.Linear(width, 10))
    n_params = sum(p.numel() for p in model.parameters())
    model, gradcomm, profile, notes = setup(args, model)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    loss_fn = nn.CrossEntropyLoss()

    steps, losses = [], []
    for i, (xb, yb) in enumerate(data):
        if i == args.warmup or (i > args.warmup and args.variant == "compute"):
            # Every rank starts the timed steps together; `compute` also aligns every step
            # (untimed), so that its per-step max over ranks is the step time of synchronous
            # training with free communication, under the same CPU contention.
            dist.barrier()
        if profile is not None:
            profile.step = i - args.warmup
        tx0, s0, (flt0, csw0, cpu0) = eth0_tx_bytes(), gradcomm_stats(gradcomm), usage()
        start, t0 = time.time(), time.perf_counter()
        opt.zero_grad(set_to_none=args.grads == "free")
        loss = loss_fn(model(xb), yb)
        t1 = time.perf_counter()
        loss.backward()  # DDP: the gradient allreduce (hook) runs inside backward
        t2 = time.perf_counter()
        opt.step()
        t3 = time.perf_counter()
        flt1, csw1, cpu1 = usage()
        tx1 = eth0_tx_bytes()
        losses.append(loss.item())
        if i >= args.warmup:
            steps.append({"start": start, "step_s": t3 - t0,
                          "forward_s": t1 - t0, "backward_s": t2 - t1, "optimizer_s": t3 - t2,
                          "cpu_s": cpu1 - cpu0, "minflt": flt1 - flt0, "preempted": csw1 - csw0,
                          "tx_bytes": None if tx0 is None else tx1 - tx0,
                          "gradcomm": delta(s0, gradcomm_stats(gradcomm))})

    mine = {"rank": rank, "steps": steps, "final_loss": losses[-1], "bucket_sizes": bucket_sizes(model),
            "hook_calls": profile.calls if profile else None,
            # compressor=auto: each key's spec as it stands at the end (what its steps ran on)
            "auto_chosen": sorted({c["chosen"] for c in gradcomm.stats().get("auto_choices", [])})
            if gradcomm is not None else []}
    everyone = [None] * world
    dist.all_gather_object(everyone, mine)
    if rank == 0:
        record = summarize(args, world, n_params, notes, everyone)
        if args.eval > 0:  # every rank holds the same parameters: rank 0's model is the model
            record.update(seed=args.seed, eval_examples=args.eval,
                          test_accuracy=test_accuracy(model, args.data, args.eval))
        text = json.dumps(record)
        if args.out:
            with open(args.out, "w") as f:
                f.write(text + "\n")
        else:
            print(text)
    dist.barrier()
    if gradcomm is not None:
        gradcomm.shutdown()
    # DDP goes before its process group. Otherwise DDP's reducer drops the group's last
    # reference when main() returns, with the GIL held, and torch 1.13's gloo destructor
    # joins a worker thread that may be waiting for the GIL to free a tensor: a deadlock
    # at exit (pytorch/pytorch#56297; seen once in CI). destroy_process_group() drops it
    # with the GIL released.
    ddp_ref = weakref.ref(model)
    del model, loss
    gc.collect()
    if ddp_ref() is not None:
        raise RuntimeError("ddp_step: the DDP module outlived its process group's teardown")
    dist.destroy_process_group()


def summarize(args, world, n_params, notes, everyone):
    def med(v):
        return float(np.median(v)) if len(v) else None

    per_rank = [[s["step_s"] for s in r["steps"]] for r in everyone]
    step_max = [max(col) for col in zip(*per_rank)]  # a DDP step ends when the slowest rank's does
    mean_of = lambda key: float(np.mean([s[key] for r in everyone for s in r["steps"]]))
    tx = [s["tx_bytes"] for r in everyone for s in r["steps"] if s["tx_bytes"] is not None]
    record = {
        "variant": args.variant, "kind": "compute" if args.variant == "compute" else "ddp",
        "ranks": world, "batch_size": args.batch_size, "params": n_params, "grads": args.grads,
        "warmup": args.warmup, "steps": args.steps, "torch": torch.__version__,
        "step_s": step_max, "step_s_median": med(step_max), "step_s_p90": float(np.percentile(step_max, 90)),
        "step_s_rank_median": [med(r) for r in per_rank],
        "forward_s_median": med([s["forward_s"] for r in everyone for s in r["steps"]]),
        "backward_s_median": med([s["backward_s"] for r in everyone for s in r["steps"]]),
        "optimizer_s_median": med([s["optimizer_s"] for r in everyone for s in r["steps"]]),
        "cpu_s_per_step": mean_of("cpu_s"), "minflt_per_step": mean_of("minflt"),
        "preempted_per_step": mean_of("preempted"),  # involuntary context switches
        "wire_bytes_per_step": float(np.mean(tx)) if tx else None,  # per rank, eth0, all protocols
        "bucket_sizes": everyone[0]["bucket_sizes"],
        "final_loss": float(np.mean([r["final_loss"] for r in everyone])),
        "auto_chosen": everyone[0]["auto_chosen"],
        **notes,
    }
    gc = [s["gradcomm"] for r in everyone for s in r["steps"] if s["gradcomm"]]
    if gc:
        record["gradcomm_per_step"] = {k: float(np.mean([g[k] for g in gc])) for k in STAT_KEYS}
    if args.profile:
        record["per_rank_steps"] = [r["steps"] for r in everyone]
        record["hook_calls"] = [r["hook_calls"] for r in everyone]
    return record


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except BaseException:  # noqa: B036 -- SystemExit and KeyboardInterrupt too
        # Exit at once: after an exception inside DDP's backward (a failing hook), torch 1.13
        # hangs at exit (a thread-local autograd graph, freed by the exit handlers, waits for
        # the GIL of the finalized interpreter), and the run would sit out its deadline.
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
