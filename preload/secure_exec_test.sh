#!/bin/sh
# secure_exec_test.sh PROBE: percpu in a set-user-ID program ignores every
# PERCPU_* variable, and the preload's trace file is never opened through a
# symbolic link.
#
# As root it copies PROBE (secure_probe.cpp) into a root-only directory and
# runs it three ways:
#   1. as root, plain: the control. PERCPU_BACKEND and PERCPU_PRELOAD_TRACE
#      take effect, so the checks below can fail.
#   2. as root, the trace path a symbolic link: nothing is written through it.
#   3. set-user-ID root, run by nobody (AT_SECURE): the backend is not forced
#      and no trace file appears in the directory nobody cannot write to.
# Prints "N passed, M failed"; exit 77 (skipped) when not root.
set -u
probe=$1
if [ "$(id -u)" != 0 ]; then
  echo "skipped: making a set-user-ID root program needs root"
  exit 77
fi
command -v setpriv >/dev/null || { echo "FAIL: setpriv (util-linux) is missing"; exit 1; }
passed=0 failed=0
check() {  # description, then a command that must succeed
  what=$1; shift
  if "$@"; then passed=$((passed + 1)); echo "ok: $what"
  else failed=$((failed + 1)); echo "FAIL: $what"; fi
}
dir=$(mktemp -d /tmp/percpu-secure.XXXXXX)
trap 'rm -rf "$dir"' EXIT
chmod 755 "$dir"
cp "$probe" "$dir/probe"
chmod 755 "$dir/probe"

PERCPU_BACKEND=syscall PERCPU_PRELOAD_TRACE="$dir/trace" "$dir/probe" >"$dir/out1" 2>&1
cat "$dir/out1"
check "control: PERCPU_BACKEND is honoured" grep -q "secure=0 backend=syscall cpu_ok=1" "$dir/out1"
check "control: the trace file is written" test -s "$dir/trace"

ln -s "$dir/target" "$dir/link"
PERCPU_PRELOAD_TRACE="$dir/link" "$dir/probe" >"$dir/out2" 2>&1
check "a symbolic link as the trace path is not followed" test ! -e "$dir/target"

rm -f "$dir/trace"
chown root:root "$dir/probe"
chmod 4755 "$dir/probe"
PERCPU_BACKEND=syscall PERCPU_PRELOAD_TRACE="$dir/trace" \
  setpriv --reuid=65534 --regid=65534 --clear-groups "$dir/probe" >"$dir/out3" 2>&1
cat "$dir/out3"
check "set-user-ID: the program ran in secure mode" grep -q "secure=1" "$dir/out3"
check "set-user-ID: PERCPU_BACKEND is ignored" grep -q "backend=rseq cpu_ok=1" "$dir/out3"
check "set-user-ID: no trace file is created" test ! -e "$dir/trace"

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
