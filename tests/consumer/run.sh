#!/usr/bin/env bash
# Installs the build tree into a scratch prefix, builds tests/consumer against it
# with find_package(gradcomm CONFIG REQUIRED), and runs it on 1 and 2 ranks with
# the installed gradcomm-run.
set -euo pipefail
build_dir=$1 source_dir=$2 work=$3 generator=${4:-Ninja}
rm -rf "$work"
mkdir -p "$work"
cmake --install "$build_dir" --prefix "$work/prefix" >/dev/null
cmake -S "$source_dir" -B "$work/build" -G "$generator" -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
cmake --build "$work/build" >/dev/null
RANK=0 WORLD_SIZE=1 "$work/build/consumer"
out=$("$work/prefix/bin/gradcomm-run" -n 2 -- "$work/build/consumer")
echo "$out"
[[ $(grep -c "gradcomm .* ok" <<<"$out") == 2 ]]
