#!/usr/bin/python3
"""The memory-traffic floor of a one-node allreduce (docs/shared-memory.md): each rank must
read its input once and write its output once, which is exactly one copy of the tensor. Run
one process per rank at once (gradcomm-run -n N, or mpirun), as the collective's ranks do:
each copies SIZE bytes (numpy.copyto, warm buffers) ITERS times, starting together at a
shared wall-clock moment, and prints its median copy time in microseconds.

    gradcomm-run -n 2 -- /usr/bin/python3 bench/shm/copy_floor.py 16777216 20
"""
import os
import sys
import time

import numpy as np

size = int(sys.argv[1]) if len(sys.argv) > 1 else 16 << 20
iters = int(sys.argv[2]) if len(sys.argv) > 2 else 20
rank = int(os.environ.get("RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")))
src = np.ones(size // 4, dtype=np.float32)
dst = np.empty_like(src)
np.copyto(dst, src)
# Start together: the next whole second.
time.sleep(max(0.0, (int(time.time()) + 2) - time.time()))
times = []
for _ in range(iters):
    t0 = time.perf_counter()
    np.copyto(dst, src)
    times.append((time.perf_counter() - t0) * 1e6)
times.sort()
print(f"copy_floor rank={rank} size={size} median_us={times[len(times) // 2]:.1f} min_us={times[0]:.1f}", flush=True)
