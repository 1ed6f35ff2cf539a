#!/usr/bin/env bash
# check_layer.sh CXX PROBE_DIR CONTROL INCLUDE_DIR... : compiles the probes against only
# the given include directories (one layer's). PROBE_DIR/CONTROL, which includes the
# layer's own headers, must compile; each PROBE_DIR/up_*.cc must fail because the
# header it names (the first quoted include) is not found.
set -uo pipefail
cxx=$1 dir=$2 control=$3; shift 3
flags=(-std=c++20 -fsyntax-only)
for d in "$@"; do flags+=("-I$d"); done
tmp=$(mktemp) && trap 'rm -f "$tmp"' EXIT

"$cxx" "${flags[@]}" "$dir/$control" >"$tmp" 2>&1 || { cat "$tmp"; echo "FAIL: the layer's own headers do not compile"; exit 1; }
echo "ok: the layer's headers compile with its include directories ($control)"
probes=("$dir"/up_*.cc)
[[ -e ${probes[0]} ]] || { echo "FAIL: no probes in $dir"; exit 1; }
for probe in "${probes[@]}"; do
  header=$(sed -n 's/^#include "\(.*\)".*/\1/p' "$probe" | head -n 1)
  if "$cxx" "${flags[@]}" "$probe" >"$tmp" 2>&1; then
    echo "FAIL: $(basename "$probe") compiled: the layer can include \"$header\""; exit 1
  fi
  # GCC: "x.h: No such file or directory"; clang: "'x.h' file not found".
  grep -qE "$header('|:)? (No such file or directory|file not found)" "$tmp" || {
    cat "$tmp"; echo "FAIL: $(basename "$probe") failed for another reason"; exit 1; }
  echo "ok: #include \"$header\" does not compile in this layer"
done
