#!/usr/bin/env bash
# gradcomm-bench speaks nccl-tests: its flags (-c -d -o -b -e -f ...) are taken with
# nccl-tests' meanings, and its table is read by an nccl-tests-style parser
# (nccl_tests_parser.py: columns found by name in the header) started
#   1. directly, one rank, no launcher and an empty environment;
#   2. under gradcomm-run -n 2, where rank 0's table must come through unprefixed;
#   3. at 4 ranks for every type and reduction (-d all -o all), each checked exactly;
# and nccl-tests' flags it does not implement are refused by name (non-zero exit), as
# are values gradcomm lacks (-o prod, -d int8, -z 0). --version prints version.h's.
#   test_nccl_compat.sh BUILD_DIR
set -uo pipefail
build=$1
here=$(cd "$(dirname "$0")" && pwd)
run=$build/tools/gradcomm-run bench=$build/bench/gradcomm-bench
fail() { echo "FAIL: $*"; exit 1; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
py() { PYTHONPATH=$here /usr/bin/python3 "$@"; }

# check_table FILE RANKS TYPES REDOPS MIN MAX: sizes MIN, 2*MIN, ... MAX (factor 4 when
# more than one type), one placement's columns (the one that ran: in place for the
# allreduce), #wrong 0, closing lines.
check_table() {
  py - "$@" <<'PY' || fail "$1: table wrong"
import sys
from nccl_tests_parser import parse
path, ranks, types, redops, lo, hi, factor = sys.argv[1:]
text = open(path).read()
t = parse(text)
for line in text.splitlines():
    assert not line.startswith("["), f"prefixed line in the table: {line!r}"
cols = t["columns"]
for name in ("size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong"):
    assert name in cols, (name, cols)
# No placement gradcomm does not run: no repeated names, no N/A cells.
assert not any(c.startswith(("out_of_place.", "in_place.")) for c in cols), cols
assert cols.index("#wrong") < cols.index("wire"), "gradcomm's columns must follow nccl-tests' ones"
placement = [l for l in text.splitlines() if l.startswith("#") and l.rstrip().endswith("-place")]
assert len(placement) == 1 and placement[0].split()[-1] == "in-place", placement
assert "in place only (gradcomm has no out-of-place allreduce)" in text, "the gradcomm line must name the placement"
elt = {"float": 4, "half": 2, "bfloat16": 2, "double": 8, "int32": 4, "int64": 8, "uint8": 1}
want_sizes = []
s = int(lo)
while s <= int(hi):
    want_sizes.append(s)
    s *= int(factor)
cases = {}
for r in t["rows"]:
    cases.setdefault((r["type"], r["redop"]), []).append(r)
want_cases = {(ty, op) for ty in types.split(",") for op in redops.split(",")}
assert set(cases) == want_cases, (sorted(cases), sorted(want_cases))
for (ty, op), rows in cases.items():
    sizes = [int(r["size"]) for r in rows]
    assert sizes == [w for w in want_sizes if w >= elt[ty]], (ty, op, sizes)
    for r in rows:
        assert int(r["count"]) == int(r["size"]) // elt[ty], r
        assert r["root"] == "-1", r
        assert float(r["time"]) > 0, r
        assert float(r["#wrong"]) == 0, r
        float(r["algbw"]); float(r["busbw"])
        if int(ranks) == 1:
            assert float(r["busbw"]) == 0, r   # 2(N-1)/N = 0
assert t["out_of_bounds"] == 0 and t["out_of_bounds_status"] == "OK", t["out_of_bounds"]
assert t["avg_busbw"] >= 0
if int(ranks) > 1:
    assert t["avg_busbw"] > 0, t["avg_busbw"]
print(path, "ok:", len(t["rows"]), "rows")
PY
}

# 1. One rank, started directly with nothing of a launcher's in the environment.
env -i "$bench" -c 1 -d float -o sum -b 8 -e 1M -f 2 >"$tmp/direct.out" 2>"$tmp/direct.err" ||
  { cat "$tmp/direct.out" "$tmp/direct.err"; fail "direct 1-rank run failed"; }
check_table "$tmp/direct.out" 1 float sum 8 1048576 2

# 2. Under gradcomm-run: rank 0's table unprefixed on stdout.
"$run" -n 2 --timeout 120 -- "$bench" -c 1 -d float -o sum -b 8 -e 1M -f 2 >"$tmp/run2.out" 2>"$tmp/run2.err" ||
  { cat "$tmp/run2.out" "$tmp/run2.err"; fail "gradcomm-run -n 2 run failed"; }
grep -q "gradcomm: 2 ranks" "$tmp/run2.out" || { cat "$tmp/run2.out"; fail "not a 2-rank table"; }
check_table "$tmp/run2.out" 2 float sum 8 1048576 2

# 3. Every type and reduction gradcomm has, exact at N = 4 (avg: halves and truncation).
"$run" -n 4 --timeout 120 -- "$bench" -c 1 -d all -o all -b 8 -e 512 -f 4 -n 2 -w 1 >"$tmp/all.out" 2>"$tmp/all.err" ||
  { cat "$tmp/all.out" "$tmp/all.err"; fail "-d all -o all failed"; }
check_table "$tmp/all.out" 4 uint8,int32,int64,half,float,double,bfloat16 sum,max,min,avg 8 512 4

# 3b. Under bare mpirun (no GRADCOMM_STORE): the ranks meet through MPI, as nccl-tests' do.
if command -v mpirun >/dev/null && ldd "$bench" | grep -q libmpi; then
  env -u GRADCOMM_STORE -u MASTER_ADDR -u MASTER_PORT OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    timeout 120 mpirun -np 2 --oversubscribe "$bench" -c 1 -d float -o sum -b 8 -e 64 -f 2 \
    >"$tmp/mpirun.out" 2>"$tmp/mpirun.err" || { cat "$tmp/mpirun.out" "$tmp/mpirun.err"; fail "bare mpirun failed"; }
  grep -q "gradcomm: 2 ranks" "$tmp/mpirun.out" || { cat "$tmp/mpirun.out"; fail "bare mpirun: not a 2-rank table"; }
  check_table "$tmp/mpirun.out" 2 float sum 8 64 2
  # reduce_scatter beside OpenMPI's MPI_Reduce_scatter_block, both checked exactly.
  env -u GRADCOMM_STORE -u MASTER_ADDR -u MASTER_PORT OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    timeout 120 mpirun -np 2 --oversubscribe "$bench" --op reduce_scatter -c 1 -d float -o sum -b 64 -e 64K -f 32 \
    --baseline mpi --json "$tmp/rs.json" >"$tmp/rs.out" 2>"$tmp/rs.err" ||
    { cat "$tmp/rs.out" "$tmp/rs.err"; fail "reduce_scatter beside MPI failed"; }
  py - "$tmp/rs.json" <<'PY' || { cat "$tmp/rs.out"; fail "reduce_scatter records wrong"; }
import json, sys
recs = json.load(open(sys.argv[1]))
assert {r["impl"] for r in recs} == {"gradcomm", "mpi"}, recs
assert sorted({r["size_bytes"] for r in recs}) == [64, 2048, 65536], recs
for r in recs:
    assert r["op"] == "reduce_scatter" and r["wrong"] == 0 and r["time_us"] > 0 and not r["in_place"], r
print("reduce_scatter beside mpi ok:", len(recs), "records")
PY
else
  echo "skipped: bare mpirun (no mpirun, or gradcomm-bench built without MPI)"
fi

# 4. nccl-tests' flags gradcomm-bench does not implement: refused by name, non-zero exit.
refused=(-t:2 -g:2 --ngpus:8 -m:2 -N:2 -p:1 -r:0 -y:1 -T:10 -G:1 -C:1 -S:1 -J:out.json -R:1 -x:1 -D:1 -V:16 -M:1
         -u:1 -I:1 -K:1 --cudagraph:1 --nthreads:2)
for fv in "${refused[@]}"; do
  flag=${fv%%:*} value=${fv#*:}
  if env -i "$bench" -b 8 -e 8 "$flag" "$value" >"$tmp/refused.out" 2>&1; then fail "$flag $value accepted"; fi
  grep -q -- "$flag.*is not supported by gradcomm-bench" "$tmp/refused.out" ||
    { cat "$tmp/refused.out"; fail "$flag: no message naming it"; }
done
# ... except -g 1 and -t 1, what every nccl-tests command line says and gradcomm does anyway:
# the same table as without them.
"$run" -n 2 --timeout 120 -- "$bench" -g 1 -t 1 -c 1 -d float -o sum -b 8 -e 64 -f 2 >"$tmp/g1.out" 2>"$tmp/g1.err" ||
  { cat "$tmp/g1.out" "$tmp/g1.err"; fail "-g 1 -t 1 refused"; }
check_table "$tmp/g1.out" 2 float sum 8 64 2
if env -i "$bench" -b 8 -e 8 -g 2 >"$tmp/refused.out" 2>&1; then fail "-g 2 accepted"; fi
grep -q -- "-g/--ngpus 2 (GPUs per thread) is not supported by gradcomm-bench: only 1" "$tmp/refused.out" ||
  { cat "$tmp/refused.out"; fail "-g 2: no message naming the value"; }
# Values gradcomm lacks: the message names the flag, the value and what is supported.
bad=("-o prod:-o prod.*sum, avg, min or max" "-d int8:-d int8.*float" "-z 0:-z 0.*-z 3" "-a 5:-a 5"
     "-d nosuch:-d 'nosuch'" "-f 1 -i 0:-i 0")
for case in "${bad[@]}"; do
  args=${case%%:*} want=${case#*:}
  # shellcheck disable=SC2086
  if env -i "$bench" -b 8 -e 8 $args >"$tmp/bad.out" 2>&1; then fail "'$args' accepted"; fi
  grep -q -- "$want" "$tmp/bad.out" || { cat "$tmp/bad.out"; fail "'$args': no message matching '$want'"; }
done

# 5. --version: the library's version (build/include/gradcomm/version.h).
want=$(sed -n 's/^#define GRADCOMM_VERSION_STRING "\(.*\)"$/\1/p' "$build/include/gradcomm/version.h")
[[ -n $want ]] || fail "no GRADCOMM_VERSION_STRING in $build/include/gradcomm/version.h"
got=$(env -i "$bench" --version) || fail "--version failed"
[[ $got == "gradcomm-bench (gradcomm) $want" ]] || fail "--version printed '$got', want version $want"
echo "PASS"
