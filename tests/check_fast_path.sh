#!/bin/sh
# check_fast_path.sh OBJDUMP OBJECT MAX_INSTRUCTIONS
#
# Disassembles the probe functions in OBJECT and checks that each fast path,
# from the function's entry to its first return, is at most MAX_INSTRUCTIONS
# instructions (the return itself not counted) and holds no call, no lock
# prefix, no system call and no barrier. Prints each fast path it checked.
set -eu
objdump=$1 object=$2 max=$3
status=0
for probe in percpu_probe_cpu_id percpu_probe_node_id percpu_probe_concurrency_id; do
  listing=$("$objdump" -d --no-show-raw-insn "$object" |
    awk -v fn="<$probe>:" '$2 == fn {on=1; next} on && /^$/ {exit} on {print}')
  if [ -z "$listing" ]; then
    echo "FAIL $probe: not found in $object"; status=1; continue
  fi
  # The fast path: everything before the first return.
  fast=$(printf '%s\n' "$listing" | awk '{ sub(/^[ \t]*[0-9a-f]+:[ \t]*/, ""); if ($1 == "ret" || $1 == "retq") exit; print }')
  count=$(printf '%s\n' "$fast" | grep -c . || true)
  echo "$probe: $count instructions before ret (limit $max):"
  printf '%s\n' "$fast" | sed 's/^/    /'
  if [ "$count" -gt "$max" ] || [ "$count" -eq 0 ]; then
    echo "FAIL $probe: $count instructions"; status=1
  fi
  if printf '%s\n' "$fast" | grep -Eq '(^|[[:space:]])(call|callq|bl|blr|lock|syscall|svc|mfence|dmb|dsb)([[:space:]]|$)'; then
    echo "FAIL $probe: call, lock, syscall or barrier on the fast path"; status=1
  fi
done
[ $status -eq 0 ] && echo "fast path shape: OK"
exit $status
