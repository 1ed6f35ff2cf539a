#!/usr/bin/env bash
# check_trainer.sh TRAINER_DIR PROBE : the reference trainer is a program written
# against the public API, as a user's is. Every quoted include in TRAINER_DIR must
# name a public header (gradcomm/...), the trainer's own (trainer/...), or one of three
# header-only helpers in base/: checksum.h (its checkpoint files' checksum, the
# communicator state's too), cublas_loader.h (cuBLAS opened at first use) and
# cli_list.h (lists on its command line). PROBE,
# which includes an internal header, must be refused by the same rule (the control).
set -uo pipefail
dir=$1 probe=$2

# Prints "file:line: include" for every quoted include outside the allowed set.
offending() {
  grep -HnE '^[[:space:]]*#[[:space:]]*include[[:space:]]+"' "$@" |
    grep -vE '#[[:space:]]*include[[:space:]]+"(gradcomm/[^"]+|trainer/[^"]+|checksum\.h|cublas_loader\.h|cli_list\.h)"'
}

bad=$(offending "$probe")
[[ -n $bad ]] || { echo "FAIL: the probe's internal include was not caught"; exit 1; }
echo "ok: the rule refuses the probe: $bad"

mapfile -t files < <(find "$dir" -type f \( -name '*.cc' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) | sort)
((${#files[@]} > 5)) || { echo "FAIL: found only ${#files[@]} source files under $dir"; exit 1; }
bad=$(offending "${files[@]}")
if [[ -n $bad ]]; then
  echo "FAIL: the trainer includes internal headers:"
  echo "$bad"
  exit 1
fi
echo "ok: ${#files[@]} trainer sources include only gradcomm/, trainer/, checksum.h, cublas_loader.h and cli_list.h"
