"""gradcomm with numpy: dense and compressed allreduce, allgather, broadcast.

    gradcomm-run -n 2 -- /usr/bin/python3 numpy_allreduce.py
    torchrun --standalone --nproc_per_node=2 numpy_allreduce.py

(with the built package on PYTHONPATH: PYTHONPATH=<build>/python)
"""
import numpy as np

import gradcomm

gradcomm.init()  # rank, size and store from the launcher's environment
rank, size = gradcomm.rank(), gradcomm.size()

# Dense, in place: rank r contributes r + i, so the sum is known exactly.
x = np.arange(8, dtype=np.float32) + rank
gradcomm.allreduce(x)
assert np.array_equal(x, size * np.arange(8) + size * (size - 1) / 2)

# Compressed: top-1% of a gradient, averaged, with error feedback kept under "fc1".
rng = np.random.default_rng(rank)
for step in range(3):
    grad = rng.standard_normal(100_000).astype(np.float32)
    gradcomm.allreduce(grad, op="avg", compression="topk:ratio=0.01", name="fc1")
nonzero = np.count_nonzero(grad)

# Every rank holds the same bytes: gather them and compare.
everyone = gradcomm.allgather(grad)
assert all(np.array_equal(everyone[0], everyone[r]) for r in range(size))

w = np.full(4, float(rank), np.float64)
gradcomm.broadcast(w, root=0)  # everyone gets rank 0's values
assert np.all(w == 0.0)

stats = gradcomm.stats()
print(f"rank {rank}/{size}: ok; top-k result has {nonzero} nonzeros; "
      f"{stats['bytes_sent']} bytes sent in {stats['ops']} collectives", flush=True)
gradcomm.shutdown()
