#!/bin/sh
# check_fast_path.sh OBJDUMP OBJECT MAX_INSTRUCTIONS MAX_AFTER
#
# Disassembles the probe functions in OBJECT. For each, the fast path is what
# runs from the entry to the first return. The check:
#   - the value is usable (the thread-pointer-relative load has executed)
#     after at most MAX_INSTRUCTIONS instructions;
#   - after that load, at most MAX_AFTER instructions before the return, and
#     none that touches memory: the sign test (test and a branch on x86-64,
#     tbnz on aarch64), no bound loaded (cpu.hpp, fast_path_offsets);
#   - no call, lock prefix, system call, barrier or acquire load anywhere on
#     the path (asm_path.sh).
# It prints each fast path it checked, like the arm64 seed's dumps.
set -eu
. "$(dirname "$0")/asm_path.sh"
objdump=$1 object=$2 max=$3 max_after=$4
status=0
for probe in percpu_probe_cpu_id percpu_probe_node_id percpu_probe_concurrency_id; do
  fast=$(probe_path "$objdump" "$object" "$probe")
  if [ -z "$fast" ]; then
    echo "FAIL $probe: not found in $object"; status=1; continue
  fi
  total=$(printf '%s\n' "$fast" | grep -c . || true)
  # The value load: %fs-relative on x86-64; a 32-bit load through a register
  # offset from the thread pointer on aarch64 (ldr wN, [xA, xB]).
  usable=$(printf '%s\n' "$fast" | awk '/%fs:/ || /ldr[ \t]+w[0-9]+, \[x[0-9]+, x[0-9]+\]/ {print NR; exit}')
  echo "$probe: value usable after ${usable:-?} instructions (limit $max), $total before ret:"
  printf '%s\n' "$fast" | sed 's/^/    /'
  if [ -z "$usable" ]; then
    echo "FAIL $probe: no thread-pointer-relative load found"; status=1
  elif [ "$usable" -gt "$max" ] || [ $((total - usable)) -gt "$max_after" ]; then
    echo "FAIL $probe: too long"; status=1
  fi
  if [ -n "$usable" ] &&
     printf '%s\n' "$fast" | awk -v from="$usable" 'NR > from' | grep -q '[[(]'; then
    echo "FAIL $probe: a memory access after the value load"; status=1
  fi
  if forbidden_on_path "$fast"; then
    echo "FAIL $probe: call, lock, syscall, barrier or acquire load on the fast path"; status=1
  fi
done
[ $status -eq 0 ] && echo "fast path shape: OK"
exit $status
