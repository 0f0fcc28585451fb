#!/bin/bash
# getcpu_preload_benchmark.sh: how much faster an unmodified program's
# sched_getcpu() gets under LD_PRELOAD=libpercpu_getcpu.so.
#
#   preload/getcpu_preload_benchmark.sh BUILD_DIR [REPETITIONS]
#
# BUILD_DIR is a configured and built percpu tree (targets percpu_getcpu,
# percpu_getcpu_probe and, if libjemalloc is installed, percpu_jemalloc_churn). Runs
# alternate with and without the preload inside one invocation, so both see
# the same machine; each table row is the median of REPETITIONS runs.
#
# 1. getcpu_probe loop: sched_getcpu() in a loop, with glibc's rseq
#    registration switched off (GLIBC_TUNABLES=glibc.pthread.rseq=0, which is
#    what an older glibc looks like), and with it on for comparison.
# 2. jemalloc_churn under MALLOC_CONF=percpu_arena:percpu, with and without
#    the tcache, in the same tunable mode; the preload's trace tells how many
#    sched_getcpu() calls jemalloc actually made.
set -euo pipefail

build=${1:?usage: getcpu_preload_benchmark.sh BUILD_DIR [REPETITIONS]}
reps=${2:-7}
case $reps in '' | *[!0-9]* | 0) echo "REPETITIONS must be a positive integer" >&2; exit 2 ;; esac
preload=$build/preload/libpercpu_getcpu.so
probe=$build/preload/getcpu_probe
churn=$build/preload/jemalloc_churn
for f in "$preload" "$probe"; do
  [[ -e $f ]] || { echo "missing $f: build targets percpu_getcpu and percpu_getcpu_probe first" >&2; exit 2; }
done

loop_calls=${PERCPU_BENCH_LOOP_CALLS:-20000000}
churn_threads=${PERCPU_BENCH_CHURN_THREADS:-4}
churn_rounds=${PERCPU_BENCH_CHURN_ROUNDS:-20000}
trace=$(mktemp)
trap 'rm -f "$trace"' EXIT

median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
field() { sed -n "s/.*$1=\([0-9.]*\).*/\1/p"; }

# run_pair LABEL ENV... -- COMMAND...: REPETITIONS alternating runs without and
# with the preload; prints one table row.
run_pair() {
  local label=$1; shift
  local -a env=()
  while [[ $1 != -- ]]; do env+=("$1"); shift; done
  shift
  local without=() with=() i
  for ((i = 0; i < reps; i++)); do
    without+=("$(env "${env[@]}" "$@" | field ns_per_[a-z]*)")
    with+=("$(env "${env[@]}" LD_PRELOAD="$preload" "$@" | field ns_per_[a-z]*)")
  done
  local m0 m1
  m0=$(printf '%s\n' "${without[@]}" | median)
  m1=$(printf '%s\n' "${with[@]}" | median)
  printf '%-64s %12.3f %12.3f %8.2fx\n' "$label" "$m0" "$m1" "$(awk -v a="$m0" -v b="$m1" 'BEGIN { print a / b }')"
}

# calls_made ENV... -- COMMAND...: "CALLS OPS", the sched_getcpu() calls the
# preload answered and the operations the program reported.
calls_made() {
  local -a env=()
  while [[ $1 != -- ]]; do env+=("$1"); shift; done
  shift
  : >"$trace"
  local ops
  ops=$(env "${env[@]}" LD_PRELOAD="$preload" PERCPU_PRELOAD_TRACE="$trace" "$@" | field ops)
  echo "$(field ' sched_getcpu' <"$trace" | head -n1) $ops"
}

off=GLIBC_TUNABLES=glibc.pthread.rseq=0
echo "median of $reps runs each; ratio = without / with"
printf '%-64s %12s %12s %9s\n' "ns per operation" "without" "with" "ratio"
run_pair "sched_getcpu() loop, glibc rseq off" $off -- "$probe" loop "$loop_calls"
run_pair "sched_getcpu() loop, glibc rseq on" -- "$probe" loop "$loop_calls"
# Where the kernel has no vDSO getcpu (arm64), glibc without rseq makes the
# system call; this row times that call against the preloaded sched_getcpu().
syscall_ns=() preload_ns=()
for ((i = 0; i < reps; i++)); do
  syscall_ns+=("$(env $off "$probe" syscall-loop "$((loop_calls / 20))" | field ns_per_call)")
  preload_ns+=("$(env $off LD_PRELOAD="$preload" "$probe" loop "$loop_calls" | field ns_per_call)")
done
m0=$(printf '%s\n' "${syscall_ns[@]}" | median)
m1=$(printf '%s\n' "${preload_ns[@]}" | median)
printf '%-64s %12.3f %12.3f %8.2fx\n' "getcpu syscall (no vDSO) vs preload, rseq off" "$m0" "$m1" \
  "$(awk -v a="$m0" -v b="$m1" 'BEGIN { print a / b }')"

if [[ -x $churn ]]; then
  for conf in percpu_arena:percpu percpu_arena:percpu,tcache:false; do
    run_pair "jemalloc $conf, $churn_threads threads, rseq off" $off MALLOC_CONF=$conf -- \
      "$churn" "$churn_threads" "$churn_rounds"
  done
  echo
  for conf in percpu_arena:percpu percpu_arena:percpu,tcache:false; do
    read -r n ops < <(calls_made $off MALLOC_CONF=$conf -- "$churn" "$churn_threads" "$churn_rounds")
    echo "jemalloc $conf: $n sched_getcpu() calls for $ops malloc and free calls"
  done
else
  echo "jemalloc_churn not built (no libjemalloc found at configure time)"
fi
