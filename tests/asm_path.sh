# tests/asm_path.sh: sourced by check_fast_path.sh and check_add_path.sh.
#
# probe_path OBJDUMP OBJECT PROBE
#   Prints the instructions of function PROBE in OBJECT from its entry to its
#   first return (not included), one per line, without addresses; nothing
#   when OBJECT has no such function.
probe_path() {
  "$1" -d --no-show-raw-insn "$2" |
    awk -v fn="<$3>:" '$2 == fn {on=1; next} on && /^$/ {exit} on {print}' |
    awk '{ sub(/^[ \t]*[0-9a-f]+:[ \t]*/, ""); if ($1 == "ret" || $1 == "retq") exit; print }'
}

# forbidden_on_path PATH_TEXT
#   True when the path holds a call, a lock prefix, a system call, a barrier
#   or an acquire load: none belongs on an inline fast path.
forbidden_on_path() {
  printf '%s\n' "$1" |
    grep -Eq '(^|[[:space:]])(call|callq|bl|blr|lock|syscall|svc|mfence|lfence|dmb|dsb|ldar|ldapr)([[:space:]]|$)'
}
