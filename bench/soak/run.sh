#!/usr/bin/env bash
# bench/soak/run.sh: the allreduce soak. Starts gradcomm-soak under gradcomm-run
# (4 ranks by default: 100,000 small allreduces, 5,000 of them warm-up, RSS and
# descriptor samples every 1,000), then reads every rank's CSV and prints, per rank,
# the RSS after the warm-up, its maximum and final value, the descriptor counts and
# the iteration rate. Exits non-zero when the job failed or when, by the CSVs, any
# rank's RSS rose more than --tolerance above its post-warm-up value or its
# descriptor count changed (the check is made here again, independently of the
# program's own verdict).
#
#   bench/soak/run.sh --build build --out /tmp/soak
#   bench/soak/run.sh --run build/tools/gradcomm-run --soak build/bench/gradcomm-soak --iters 10000
#
# Output in --out: soak-rank<R>.csv (one per rank), soak.csv (all ranks), log.txt.
set -euo pipefail

usage() {
  sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'
  cat <<'EOF'
Options (defaults in brackets):
  --build DIR          build tree holding tools/gradcomm-run and bench/gradcomm-soak [build]
  --run PATH           gradcomm-run (overrides --build)
  --soak PATH          gradcomm-soak (overrides --build)
  --ranks N            [4]
  --iters N            allreduces per rank [100000]
  --warmup N           iterations before the baseline sample [5000]
  --sample-every N     [1000]
  --tolerance F        allowed RSS growth after the warm-up, as a fraction [0.10]
  --timeout S          whole-job limit for gradcomm-run [iters/100 + 60]
  --out DIR            [soak-out]
  -- ARGS...           passed on to gradcomm-soak (e.g. --sizes, --compressors)
EOF
}

build=build run="" soak="" ranks=4 iters=100000 warmup=5000 sample_every=1000 tolerance=0.10 timeout="" out=soak-out
extra=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --run) run=$2; shift 2 ;;
    --soak) soak=$2; shift 2 ;;
    --ranks) ranks=$2; shift 2 ;;
    --iters) iters=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --sample-every) sample_every=$2; shift 2 ;;
    --tolerance) tolerance=$2; shift 2 ;;
    --timeout) timeout=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) usage; exit 0 ;;
    *) echo "run.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
run=${run:-$build/tools/gradcomm-run}
soak=${soak:-$build/bench/gradcomm-soak}
timeout=${timeout:-$((iters / 100 + 60))}
for exe in "$run" "$soak"; do
  [[ -x $exe ]] || { echo "run.sh: $exe is not an executable (build it, or pass --build/--run/--soak)" >&2; exit 2; }
done

mkdir -p "$out"
rm -f "$out"/soak-rank*.csv "$out"/soak.csv
echo "soak: $ranks ranks x $iters allreduces (warm-up $warmup, samples every $sample_every), out $out"
set +e
"$run" -n "$ranks" --timeout "$timeout" -- "$soak" --iters "$iters" --warmup "$warmup" \
  --sample-every "$sample_every" --rss-tolerance "$tolerance" --csv-dir "$out" "${extra[@]}" 2>&1 | tee "$out/log.txt"
job_rc=${PIPESTATUS[0]}
set -e

# All ranks in one CSV (one header).
shopt -s nullglob
csvs=("$out"/soak-rank*.csv)
if [[ ${#csvs[@]} -gt 0 ]]; then
  head -n 1 "${csvs[0]}" > "$out/soak.csv"
  for f in "${csvs[@]}"; do tail -n +2 "$f"; done | sort -t, -k1,1n -k2,2n >> "$out/soak.csv"
fi

# Per rank, from the CSV alone: baseline = the first sample at or after the warm-up.
csv_rc=0
awk -F, -v tol="$tolerance" -v warm="$warmup" -v ranks="$ranks" '
  NR == 1 { next }
  {
    r = $1; it = $2 + 0; rss = $5 + 0; fds = $6 + 0
    if (it < warm) next
    if (!(r in base)) { base[r] = rss; maxr[r] = rss; fmin[r] = fds; fmax[r] = fds; seen++ }
    if (rss > maxr[r]) maxr[r] = rss
    if (fds < fmin[r]) fmin[r] = fds
    if (fds > fmax[r]) fmax[r] = fds
    final[r] = rss; last_it[r] = it; last_t[r] = $4 + 0
  }
  END {
    printf "%-5s %12s %12s %8s %12s %9s %10s  %s\n", "rank", "rss_warm_KiB", "rss_max_KiB", "growth", \
           "rss_final_KiB", "fds", "iters/s", "verdict"
    bad = 0
    for (r = 0; r < ranks; r++) {
      if (!(r in base)) { printf "%-5d no samples after the warm-up: FAIL\n", r; bad = 1; continue }
      g = (maxr[r] - base[r]) / base[r]
      ok = (g <= tol + 0) && (fmin[r] == fmax[r])
      if (!ok) bad = 1
      printf "%-5d %12d %12d %7.1f%% %12d %4d..%-4d %10.0f  %s\n", r, base[r], maxr[r], 100 * g, final[r], \
             fmin[r], fmax[r], last_it[r] / last_t[r], ok ? "PASS" : "FAIL"
    }
    exit bad
  }' "$out/soak.csv" || csv_rc=$?

if [[ $job_rc -ne 0 || $csv_rc -ne 0 ]]; then
  echo "soak: FAIL (job exit $job_rc; CSV check $([[ $csv_rc -eq 0 ]] && echo pass || echo fail))"
  exit 1
fi
echo "soak: PASS (RSS within $(awk -v t="$tolerance" 'BEGIN { printf "%g", 100 * t }') % of its post-warm-up value, descriptors constant, on every rank)"
