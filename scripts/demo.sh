#!/usr/bin/env bash
# The main job: data-parallel training with compressed gradients. Four ranks on
# the CPU train the Fashion-MNIST MLP with top-k 1 % (error feedback, DGC momentum
# correction, biases dense), then the script prints the final test accuracy and
# how many gradient bytes were saved against the dense ring allreduce.
#   scripts/demo.sh                         3 epochs (a couple of minutes on 2 cores)
#   EPOCHS=10 scripts/demo.sh               the full run of bench/results/training-cpu-*.md
#   COMPRESSOR=quant:bits=4 MC=0 scripts/demo.sh
set -euo pipefail
cd "$(dirname "$0")/.."

build_dir=${BUILD_DIR:-build}
epochs=${EPOCHS:-3}
compressor=${COMPRESSOR:-topk:ratio=0.01,min_numel=1024}
mc_flag=$([[ ${MC:-1} == 1 ]] && echo --momentum-correction || true)

scripts/install-deps.sh
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build_dir" -j"$(nproc)" --target gradcomm-run gradcomm-train

log=$(mktemp -t gradcomm-demo.XXXXXX.jsonl)
trap 'rm -f "$log"' EXIT
export OPENBLAS_NUM_THREADS=1  # one BLAS thread per rank: 4 ranks already fill the cores
"$build_dir/tools/gradcomm-run" -n 4 -- "$build_dir/trainer/gradcomm-train" \
  --epochs "$epochs" --batch-size 32 --lr 0.1 --momentum 0.9 --warmup-epochs 0.5 \
  --compressor "$compressor" $mc_flag --log "$log"

/usr/bin/python3 - "$log" "$compressor" <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
wire = sum(l["wire_bytes"] for l in lines)
dense = sum(l["dense_bytes"] for l in lines)
last = lines[-1]
print(f"\ndemo: {sys.argv[2]} on {last['world_size']} ranks, {len(lines)} epochs: "
      f"test accuracy {last['test_accuracy']:.4f}")
print(f"demo: gradient bytes sent by rank 0: {wire / 1e6:.1f} MB; the dense ring would have sent "
      f"{dense / 1e6:.1f} MB: {dense / wire:.1f}x fewer ({100 * (1 - wire / dense):.1f} % saved)")
PY
