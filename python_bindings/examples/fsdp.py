"""Compressed FSDP: an MLP trained on Fashion-MNIST with torch's FSDP, its gradients'
reduce-scatters compressed by the "gradcomm" process group. The model code is plain
FSDP; only the process group differs:

    dist.init_process_group("gradcomm")
    gradcomm.torch.set_compression(dist.group.WORLD, "quant:bits=8")

Run (2 ranks; any launcher that sets RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT):

    torchrun --nproc_per_node=2 python_bindings/examples/fsdp.py --compression topk:ratio=0.01
    torchrun --nproc_per_node=2 python_bindings/examples/fsdp.py --backend gloo        # dense FSDP

On a gloo (or NCCL) group, FSDP2's own hook compresses just the reduce-scatters, the
way compression_hook does for DDP (--reduce-scatter SPEC; torch 2.x, fully_shard):

    comm = gradcomm.torch.CompressedReduceScatter("quant:bits=8")
    for module in fsdp_modules:
        module.set_custom_reduce_scatter(comm)

    torchrun --nproc_per_node=2 python_bindings/examples/fsdp.py --backend gloo --reduce-scatter quant:bits=8

--fsdp fully_shard (FSDP2, the default where torch has it) or fsdp1
(FullyShardedDataParallel). Each rank trains on its own half of the training set; the
accuracy is on the 10,000 test images. One JSON line per epoch on rank 0 (--json FILE
too): train loss, test accuracy, step time, and the group's counters (bytes on the
wire against a dense ring's). At the end every rank checks that its all-gathered
parameters are bitwise those of every other rank (through torch's store) and prints
'fsdp: parameters identical on all N ranks'."""
import argparse
import datetime
import gzip
import hashlib
import json
import os
import struct
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn

import gradcomm.torch as gtorch

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--backend", default="gradcomm", choices=["gradcomm", "gloo"])
parser.add_argument("--compression", default="quant:bits=8", help="gradcomm spec (--backend gradcomm)")
parser.add_argument("--reduce-scatter", default=None, metavar="SPEC",
                    help="--backend gloo, fully_shard: compress the reduce-scatters with "
                         "gradcomm.torch.CompressedReduceScatter(SPEC)")
parser.add_argument("--fsdp", default="fully_shard", choices=["fully_shard", "fsdp1"])
parser.add_argument("--reduce-dtype", default="float32", choices=["float32", "bfloat16"],
                    help="fully_shard: the gradients' type in the reduce-scatters (MixedPrecisionPolicy)")
parser.add_argument("--data", default="/usr/share/datasets/fashion-mnist", help="Fashion-MNIST idx .gz files")
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--batch-size", type=int, default=64, help="per rank")
parser.add_argument("--lr", type=float, default=0.05)
parser.add_argument("--hidden", default="512,256")
parser.add_argument("--seed", type=int, default=1)
parser.add_argument("--max-steps", type=int, default=0, help="stop each epoch after this many steps (0: all)")
parser.add_argument("--json", help="append the per-epoch records to this file (rank 0)")
args = parser.parse_args()
if args.reduce_dtype != "float32" and args.fsdp != "fully_shard":
    parser.error("--reduce-dtype goes with --fsdp fully_shard")
if args.reduce_scatter and (args.backend != "gloo" or args.fsdp != "fully_shard"):
    parser.error("--reduce-scatter goes with --backend gloo --fsdp fully_shard")


def load_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    magic, count = struct.unpack(">II", data[:8])
    dims = [count] + ([struct.unpack(">II", data[8:16])[0], struct.unpack(">II", data[8:16])[1]]
                      if magic == 2051 else [])
    offset = 16 if magic == 2051 else 8
    return np.frombuffer(data, dtype=np.uint8, offset=offset).reshape(dims)


def dataset(kind):
    prefix = "train" if kind == "train" else "t10k"
    x = load_idx(os.path.join(args.data, f"{prefix}-images-idx3-ubyte.gz")).reshape(-1, 784)
    y = load_idx(os.path.join(args.data, f"{prefix}-labels-idx1-ubyte.gz"))
    return torch.from_numpy(x.astype(np.float32) / 255.0), torch.from_numpy(y.astype(np.int64))


torch.set_num_threads(1)
dist.init_process_group(args.backend, timeout=datetime.timedelta(seconds=120))
rank, world = dist.get_rank(), dist.get_world_size()
if args.backend == "gradcomm":
    # Every float32 reduction of at least 1024 elements on this group is compressed:
    # FSDP's reduce-scatters. Its parameter all-gathers stay exact.
    gtorch.set_compression(dist.group.WORLD, args.compression)

torch.manual_seed(args.seed)  # the same initial model on every rank
sizes = [784] + [int(h) for h in args.hidden.split(",")] + [10]
layers = []
for i in range(len(sizes) - 1):
    layers.append(nn.Linear(sizes[i], sizes[i + 1]))
    if i < len(sizes) - 2:
        layers.append(nn.ReLU())
model = nn.Sequential(*layers)

if args.fsdp == "fully_shard":
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    mesh = init_device_mesh("cpu", (world,))
    policy = MixedPrecisionPolicy(reduce_dtype=getattr(torch, args.reduce_dtype))
    modules = [fully_shard(layer, mesh=mesh, mp_policy=policy) for layer in model if isinstance(layer, nn.Linear)]
    modules.append(fully_shard(model, mesh=mesh, mp_policy=policy))
    if args.reduce_scatter:
        reduce_scatter = gtorch.CompressedReduceScatter(args.reduce_scatter)
        for module in modules:
            module.set_custom_reduce_scatter(reduce_scatter)
else:
    from torch.distributed.fsdp import FullyShardedDataParallel
    model = FullyShardedDataParallel(model, device_id=torch.device("cpu"), use_orig_params=True)
opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)

train_x, train_y = dataset("train")
test_x, test_y = dataset("test")
train_x, train_y = train_x[rank::world], train_y[rank::world]  # this rank's half
order = torch.Generator().manual_seed(args.seed + rank)


def full_parameters():
    """Every parameter, unsharded (an exact all-gather), in a fixed order."""
    if args.fsdp == "fully_shard":
        return [p.full_tensor().detach() for p in model.parameters()]
    from torch.distributed.fsdp import FullyShardedDataParallel
    with FullyShardedDataParallel.summon_full_params(model):
        return [p.detach().clone() for p in model.parameters()]


def evaluate():
    model.eval()
    with torch.no_grad():
        correct = sum(int((model(test_x[i:i + 1000]).argmax(1) == test_y[i:i + 1000]).sum())
                      for i in range(0, len(test_x), 1000))
    model.train()
    return correct / len(test_x)


for epoch in range(1, args.epochs + 1):
    perm = torch.randperm(len(train_x), generator=order)
    steps = len(perm) // args.batch_size
    if args.max_steps:
        steps = min(steps, args.max_steps)
    loss_sum, started = 0.0, time.perf_counter()
    for s in range(steps):
        idx = perm[s * args.batch_size:(s + 1) * args.batch_size]
        loss = nn.functional.cross_entropy(model(train_x[idx]), train_y[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        loss_sum += loss.item()
    step_s = (time.perf_counter() - started) / steps
    accuracy = evaluate()
    record = {"epoch": epoch, "backend": args.backend, "fsdp": args.fsdp, "world": world,
              "reduce_dtype": args.reduce_dtype,
              "compression": (args.compression if args.backend == "gradcomm" else
                              f"{args.reduce_scatter} (gloo, CompressedReduceScatter)" if args.reduce_scatter else
                              "none (gloo)"),
              "train_loss": loss_sum / steps, "test_accuracy": accuracy, "step_s": step_s, "steps": steps}
    if args.backend == "gradcomm":
        st = gtorch.stats()
        record.update({k: st[k] for k in ("bytes_sent", "gathered_bytes", "dense_ring_bytes", "reductions",
                                          "compressed_reductions", "encode_s", "decode_s", "comm_s")})
        # What the reduce-scatters put on the wire, against a dense ring's payload (since
        # the library's reduce-scatter, dense_ring_bytes counts (N-1)/N per reduce-scatter).
        record["reduce_bytes_sent"] = st["bytes_sent"] - st["gathered_bytes"]
        record["dense_reduce_scatter_bytes"] = st["dense_ring_bytes"]
    elif args.reduce_scatter:
        import gradcomm
        st = reduce_scatter.stats()
        record.update({k: st[k] for k in ("reductions", "compressed_reductions")})
        record["reduce_bytes_sent"] = gradcomm.stats()["bytes_sent"]  # only the reduce-scatters use gradcomm here
        record["dense_reduce_scatter_bytes"] = st["dense_reduce_scatter_bytes"]
    if rank == 0:
        print(json.dumps(record), flush=True)
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps(record) + "\n")

# The ranks hold different shards; what they must agree on is the model those shards
# make up: all-gather it on every rank and compare the bytes through torch's store.
digest = hashlib.sha256(b"".join(p.contiguous().numpy().tobytes() for p in full_parameters())).hexdigest()
store = dist.distributed_c10d._get_default_store()
store.set(f"fsdp-example/{rank}", digest)
for q in range(world):
    store.wait([f"fsdp-example/{q}"], datetime.timedelta(seconds=60))
    if store.get(f"fsdp-example/{q}").decode() != digest:
        raise SystemExit(f"fsdp: rank {q}'s parameters differ from rank {rank}'s")
print(f"rank {rank}: fsdp: parameters identical on all {world} ranks (digest {digest[:16]})", flush=True)
dist.destroy_process_group()
