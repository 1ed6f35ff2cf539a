#!/usr/bin/env bash
# Before/after, interleaved by round: the blocking library (c33b45d, /work/baseline/build)
# against this tree's build, same variants, same machine state.
cd /work/main
for round in 1 2 3; do
  for rate in 1gbit 10gbit; do
    for b in new old; do
      build=build; [[ $b == old ]] && build=/work/baseline/build
      bench/e2e/run.sh --ranks 4 --rates $rate --rounds 1 --steps 30 --build $build \
        --variants "gloo;gradcomm:none;gradcomm:quant:bits=4;gradcomm:topk:ratio=0.01" \
        --out /tmp/ba/$b-$rate-r$round 2>&1 | grep "step\|FAIL" | sed "s/^/$b /"
    done
  done
done
