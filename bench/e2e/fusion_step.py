#!/usr/bin/python3
"""Fusion's effect on one training step's gradients, without the model: the six
gradients of the MLP 784-2048-2048-10 issued as DistributedOptimizer issues them
(allreduce_async in backward order, all at once), then waited; 5 warm-up and 35
timed steps, a barrier before each. Rank 0 prints the median and p90 step time and
how many calls travelled fused. `SPEC small` instead issues 200 tensors of 1000
elements (a model of many small layers: norms, biases).

    for f in 0 4M 128M; do GRADCOMM_FUSION_BYTES=$f PYTHONPATH=build/python \\
        build/tools/gradcomm-run -n 4 -- /usr/bin/python3 bench/e2e/fusion_step.py topk:ratio=0.01; done
"""
import os
import sys
import time

import numpy as np

import gradcomm

SIZES = [("fc3.weight", 20480), ("fc3.bias", 10), ("fc2.weight", 2048 * 2048), ("fc2.bias", 2048),
         ("fc1.weight", 2048 * 784), ("fc1.bias", 2048)]

gradcomm.init()
spec = sys.argv[1] if len(sys.argv) > 1 else "none"
if len(sys.argv) > 2 and sys.argv[2] == "small":
    SIZES = [(f"t{i}", 1000) for i in range(200)]
rng = np.random.default_rng(gradcomm.rank())
grads = {name: rng.standard_normal(numel).astype(np.float32) for name, numel in SIZES}
times = []
for step in range(40):
    gradcomm.barrier()
    t0 = time.perf_counter()
    works = [gradcomm.allreduce_async(grads[name], op="avg", compression=spec, name=None if spec == "none" else name)
             for name, _ in SIZES]
    for work in works:
        work.wait()
    times.append(time.perf_counter() - t0)
t = np.array(times[5:]) * 1e3
stats = gradcomm.stats()
if gradcomm.rank() == 0:
    print(f"RESULT spec={spec} tensors={len(SIZES)} fusion_bytes={os.environ.get('GRADCOMM_FUSION_BYTES', 'default')} "
          f"median_ms={np.median(t):.2f} p90_ms={np.percentile(t, 90):.2f} fused_calls={stats['fused_calls']} "
          f"ops={stats['ops']}", flush=True)
gradcomm.shutdown()
