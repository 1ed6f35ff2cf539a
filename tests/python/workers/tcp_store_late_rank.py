"""Rank program: gradcomm.init(store=torch TCPStore) where the ranks arrive late, one
after another (rank r sleeps r * DELAY seconds first), so the early ones look for keys
that appear only later. torch 1.13's TCPStore.wait() with a deadline that expires puts
its connection out of step; gradcomm must still rendezvous and then allreduce right.
  tcp_store_late_rank.py PORT RANK WORLD_SIZE DELAY
Prints 'OK tcp-store rank=R'."""
import datetime
import sys
import time

import numpy as np
import torch.distributed as dist

import gradcomm

port, rank, n, delay = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
store = dist.TCPStore("127.0.0.1", port, n, rank == 0, timeout=datetime.timedelta(seconds=60))
time.sleep(rank * delay)
gradcomm.init(rank=rank, world_size=n, store=store, timeout=60)
x = np.full(1000, float(rank + 1), dtype=np.float32)
gradcomm.allreduce(x)
assert np.all(x == n * (n + 1) / 2), x[:4]
gradcomm.shutdown()
print(f"OK tcp-store rank={rank}", flush=True)
