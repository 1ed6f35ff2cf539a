#!/bin/bash
# interleaved: rounds x chunk size, N = 2; OpenMPI (vader/CMA under mpirun) in the same run
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cd /work/main
for r in 1 2 3; do
  for c in 256K 1M 4M; do
    port=$((29000 + RANDOM % 1000))
    out=/tmp/chunk/c${c}_r$r.txt
    echo "load $(cut -d' ' -f1-3 /proc/loadavg)" > $out
    timeout 300 mpirun -n 2 --oversubscribe --bind-to none -x GRADCOMM_STORE=tcp://127.0.0.1:$port -x GRADCOMM_CHUNK_BYTES=$c \
      build/bench/gradcomm-bench -b 256K -e 16M -f 4 -n 40 -w 4 --baseline mpi >> $out 2>&1
  done
done
