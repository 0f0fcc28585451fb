#!/bin/sh
# expect_output.sh PATTERN COMMAND [ARGS...]
# Runs COMMAND, shows its output, and passes only if it exited with status 0
# AND printed a line matching PATTERN (grep -E) AND printed no line with
# WRONG. ctest's PASS_REGULAR_EXPRESSION alone ignores the exit status, so a
# program that crashed after printing the expected line would pass.
pattern=$1
shift
out=$("$@" 2>&1)
status=$?
printf '%s\n' "$out"
if [ "$status" -ne 0 ]; then
  echo "expect_output.sh: exit status $status (want 0): $*" >&2
  exit 1
fi
if ! printf '%s\n' "$out" | grep -Eq -- "$pattern"; then
  echo "expect_output.sh: no line matches '$pattern'" >&2
  exit 1
fi
if printf '%s\n' "$out" | grep -q WRONG; then
  echo "expect_output.sh: a line says WRONG" >&2
  exit 1
fi
