#!/usr/bin/env bash
# check_base.sh CXX PROBE_DIR INCLUDE_DIR... : compiles the probes against only the
# given include directories (gradcomm_base's). base_headers.cc must compile; each
# up_*.cc must fail because the header it names is not found.
set -uo pipefail
cxx=$1 dir=$2; shift 2
flags=(-std=c++20 -fsyntax-only)
for d in "$@"; do flags+=("-I$d"); done
tmp=$(mktemp) && trap 'rm -f "$tmp"' EXIT

"$cxx" "${flags[@]}" "$dir/base_headers.cc" >"$tmp" 2>&1 || { cat "$tmp"; echo "FAIL: base's own headers do not compile"; exit 1; }
echo "ok: base's headers compile with base's include directories"
for probe in "$dir"/up_*.cc; do
  header=$(sed -n 's/^#include "\(.*\)".*/\1/p' "$probe" | head -n 1)
  if "$cxx" "${flags[@]}" "$probe" >"$tmp" 2>&1; then
    echo "FAIL: $(basename "$probe") compiled: base can include \"$header\""; exit 1
  fi
  # GCC: "x.h: No such file or directory"; clang: "'x.h' file not found".
  grep -qE "$header('|:)? (No such file or directory|file not found)" "$tmp" || {
    cat "$tmp"; echo "FAIL: $(basename "$probe") failed for another reason"; exit 1; }
  echo "ok: #include \"$header\" from base does not compile"
done
