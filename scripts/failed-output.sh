#!/usr/bin/env bash
# Prints the last lines of each failed test's own output from a ctest run, so that a
# log of which only the tail survives (CI's) still says why a test failed.
#   scripts/failed-output.sh BUILD_DIR [LINES]
set -uo pipefail
dir=$1
lines=${2:-40}
failed="$dir/Testing/Temporary/LastTestsFailed.log"
log="$dir/Testing/Temporary/LastTest.log"
[[ -r $failed && -r $log ]] || exit 0
while IFS=: read -r _ name; do
  [[ -n $name ]] || continue
  # A test's block: "Test: NAME" ... "Output:" / dashes ... "<end of output>".
  output=$(awk -v name="$name" '
    $0 ~ "^[0-9]+/[0-9]+ Test: " && $3 == name { mine = 1; next }
    mine && /^Output:$/ { getline; inside = 1; next }
    inside && /^<end of output>$/ { exit }
    inside { print }' "$log")
  # The error lines first (a launcher's epilogue can push a rank's own error out of the
  # tail): each distinct one once, at most 20.
  echo "---- errors in the output of $name ($dir) ----"
  grep -E 'Error|error:|Traceback|Assertion|FAILED|terminate called|Abort' <<<"$output" | awk '!seen[$0]++' | head -n 20
  echo "---- output of $name ($dir), last $lines lines ----"
  tail -n "$lines" <<<"$output"
done < "$failed"
