#!/bin/bash
# interleaved: rounds x (cma on/off) x N in {2,4}; OpenMPI (vader/CMA under mpirun) in the same run
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cd /work/main
for r in 1 2 3; do
  for n in 2 4; do
    for cma in on off; do
      port=$((29000 + RANDOM % 1000))
      extra=""; [[ $cma == off ]] && extra="-x GRADCOMM_CMA_MIN_BYTES=0"
      out=/tmp/cmab/n${n}_${cma}_r$r.txt
      echo "load $(cut -d' ' -f1-3 /proc/loadavg)" > $out
      timeout 300 mpirun -n $n --oversubscribe --bind-to none -x GRADCOMM_STORE=tcp://127.0.0.1:$port $extra \
        build/bench/gradcomm-bench -b 256K -e 64M -f 4 -n 20 -w 2 --baseline mpi >> $out 2>&1
    done
  done
done
