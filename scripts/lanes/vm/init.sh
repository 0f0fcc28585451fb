#!/bin/busybox sh
# /init of the VM lanes' initramfs (aarch64-system, kernels): Debian's static
# busybox runs it as PID 1 of the booted kernel. It prints the kernel and the
# CPUs online, runs the run list, prints one PASS or FAIL line per run and a
# summary line, and powers the VM off. Its own lines start with "$TAG: "
# (the kernel hands TAG=... from its command line to init's environment) so
# the host can tell them from the tests' output.
#
#   init [RUN_LIST]   (default /lane/runs; not as PID 1 it only runs the list,
#                      which is how the kernels lane runs it on this machine)
#
# The run list is a shell file written by the lane, one line a run:
#   run NAME [timeout=SECONDS] [cwd=DIR] [mode] [rseq] -- [VAR=VALUE...] PROGRAM [ARG...]
# A run passes when PROGRAM exits 0 within its time limit, in an environment
# holding only those settings. `mode`: it must print its rseq mode
# ("owner=..."). `rseq`: rseq must have served it (no owner=none; backend rseq
# where it names one), so a test that silently fell back fails here even if
# its own checks passed. With PERCPU_EXPECT_OWNER among its settings, the
# owner it printed must be that one.

TAG=${TAG:-vm}
say() { echo "$TAG: $*"; }

if [ $$ -eq 1 ]; then
  /bin/busybox mkdir -p /proc /sys /dev /tmp
  /bin/busybox mount -t proc proc /proc
  # The applets' links need /proc to find the busybox binary.
  /bin/busybox --install -s /bin
  export PATH=/bin
  mount -t sysfs sysfs /sys
  mount -t devtmpfs devtmpfs /dev
fi

passed=0 failed=0
out=${TMPDIR:-/tmp}/vm-run-output.$$
run() {
  name=$1 limit=300 dir=. mode= rseq= expect=
  shift
  while [ "$1" != -- ]; do
    case $1 in
      timeout=*) limit=${1#*=} ;;
      cwd=*) dir=${1#*=} ;;
      mode) mode=1 ;;
      rseq) rseq=1 ;;
    esac
    shift
  done
  shift
  for word; do case $word in PERCPU_EXPECT_OWNER=*) expect=${word#*=} ;; esac; done
  say "RUN $name"
  start=$(date +%s)
  # Into a file, not a pipe: a child the test leaves behind cannot hold the
  # run open.
  (cd "$dir" && exec timeout -s KILL "$limit" env -i PATH=/bin HOME=/tmp TMPDIR=/tmp "$@") >"$out" 2>&1
  status=$?
  seconds=$(($(date +%s) - start))
  # As PID 1, whatever the test left running goes before the next run.
  [ $$ -ne 1 ] || kill -KILL -1 2>/dev/null
  cat "$out"
  owner=$(sed -n 's/.*owner=\([^ ,:]*\).*/\1/p' "$out" | head -n1)
  # gtest binaries print "backend=X"; the C API test "C API checked ... backend X:".
  backend=$(sed -n -e 's/.*backend=\([^ ,:]*\).*/\1/p' -e 's/.*C API checked.*backend \([^ ,:]*\).*/\1/p' "$out" | head -n1)
  why=
  if [ $status -ne 0 ] && [ $seconds -ge "$limit" ]; then why="timed out after $limit s"
  elif [ $status -gt 128 ]; then why="killed by signal $((status - 128))"
  elif [ $status -ne 0 ]; then why="exit status $status"
  elif [ -n "$mode" ] && [ -z "$owner" ]; then why="printed no rseq mode line"
  elif [ -n "$rseq" ] && grep -q 'owner=none' "$out"; then why="rseq expected but the run reported owner=none"
  elif [ -n "$rseq" ] && [ -n "$backend" ] && [ "$backend" != rseq ]; then why="rseq expected but the run was served by $backend"
  elif [ -n "$expect" ] && [ -n "$owner" ] && [ "$owner" != "$expect" ]; then why="owner $owner, expected $expect"
  fi
  if [ -z "$why" ]; then
    passed=$((passed + 1))
    say "PASS $name ($seconds s, owner=${owner:--}, backend=${backend:--})"
  else
    failed=$((failed + 1))
    say "FAIL $name ($seconds s, owner=${owner:--}, backend=${backend:--}: $why)"
  fi
}

say "kernel $(uname -srvm)"
say "cpus online: $(nproc)"
list=${1:-/lane/runs}
began=$(date +%s)
if [ -r "$list" ]; then . "$list"; else say "cannot read $list"; failed=$((failed + 1)); fi
[ $((passed + failed)) -gt 0 ] || { say "the run list $list lists no runs"; failed=1; }
rm -f "$out"
say "runs finished in $(($(date +%s) - began)) s"
say "$passed passed, $failed failed"
[ $$ -ne 1 ] || poweroff -f
[ $failed -eq 0 ]
