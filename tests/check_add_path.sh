#!/bin/sh
# check_add_path.sh OBJDUMP OBJECT MAX_INSTRUCTIONS
#
# Disassembles the structures' hot-add probes in OBJECT (fast_path_probe.cpp):
# what a user's counter.add(1) and per_cpu<T>::add() become. For each, the
# path is what runs from the entry to the first return, which is the
# committed add. The check, for the started section (internal/rseq_cs.hpp):
#   - exactly two conditional branches: the test of the object's pointer
#     (no copies yet) and the section's compare of cpu_id with the CPU it
#     started on; none for a bound or a sign of the CPU;
#   - at most MAX_INSTRUCTIONS instructions before the return;
#   - no call, lock prefix, system call, barrier or acquire load (asm_path.sh).
# It prints each path it checked.
set -eu
. "$(dirname "$0")/asm_path.sh"
objdump=$1 object=$2 max=$3
status=0
for probe in percpu_probe_counter_add percpu_probe_per_cpu_add; do
  path=$(probe_path "$objdump" "$object" "$probe")
  if [ -z "$path" ]; then
    echo "FAIL $probe: not found in $object"; status=1; continue
  fi
  total=$(printf '%s\n' "$path" | grep -c . || true)
  # x86-64: jcc (not jmp); aarch64: b.cond, cbz/cbnz, tbz/tbnz.
  branches=$(printf '%s\n' "$path" | awk '$1 ~ /^j/ && $1 != "jmp" && $1 != "jmpq" {n++}
    $1 ~ /^b\./ || $1 == "cbz" || $1 == "cbnz" || $1 == "tbz" || $1 == "tbnz" {n++} END {print n+0}')
  echo "$probe: $total instructions before ret (limit $max), $branches conditional branches (want 2):"
  printf '%s\n' "$path" | sed 's/^/    /'
  if [ "$total" -gt "$max" ]; then
    echo "FAIL $probe: too long"; status=1
  fi
  if [ "$branches" -ne 2 ]; then
    echo "FAIL $probe: a test besides the pointer's and the section's compare"; status=1
  fi
  if forbidden_on_path "$path"; then
    echo "FAIL $probe: call, lock, syscall, barrier or acquire load on the path"; status=1
  fi
done
[ $status -eq 0 ] && echo "hot add shape: OK"
exit $status
