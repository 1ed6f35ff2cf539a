#!/usr/bin/env bash
cd /work/main
for round in 1 2 3; do
  for b in new old; do
    build=build; [[ $b == old ]] && build=/work/baseline/build
    bench/e2e/run.sh --ranks 2 --rates 1gbit --rounds 1 --steps 30 --build $build \
      --variants "gloo;gradcomm:none;gradcomm:quant:bits=4;gradcomm:topk:ratio=0.01;compute" \
      --out /tmp/ba/n2-$b-r$round 2>&1 | grep "step\|FAIL" | sed "s/^/$b /"
  done
done
