#!/usr/bin/env bash
# Checks docs/promises.md against the sources: every test it names
# (`binary:Suite.Name`) is a TEST, TEST_F, TEST_P or TYPED_TEST of that
# name in binary.cpp (a typed suite: every type's case),
# and binary is a test CMake registers (percpu_cc_test); every
# `path/file.cpp:function` names a function that file defines; every
# "mutant N" has its patch in tests/mutants/. Rows marked **gap** name no
# test yet: listed, not failed. Every other row must name at least one test.
# Usage: scripts/promises.sh [TABLE]    (exit 1 on the first kind of error)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
table=${1:-$root/docs/promises.md}
status=0 rows=0 gaps=0 tests=0

fail() { echo "promises.sh: $table: $*" >&2; status=1; }

# The test source of a binary: NAME.cpp beside the CMakeLists.txt whose
# percpu_cc_test(NAME NAME ...) builds it (or NAME_KIND, one binary per kind
# built from the same source, as early_use_test_KIND).
source_of() {
  local name=$1 list
  list=$(grep -rlE --include=CMakeLists.txt "percpu_cc_test\(NAME ${name}[ _]" "$root/percpu" "$root/tests" || true)
  [ -n "$list" ] || return 1
  local dir
  dir=$(dirname "$(echo "$list" | head -1)")
  [ -f "$dir/$name.cpp" ] && echo "$dir/$name.cpp"
}

while IFS= read -r line; do
  case $line in
    '| section '* | '|---'*) continue ;;
    '| '*) ;;
    *) continue ;;
  esac
  rows=$((rows + 1))
  promise=$(echo "$line" | cut -d'|' -f3 | cut -c1-70)
  if [[ $line == *'**gap**'* ]]; then
    gaps=$((gaps + 1))
    echo "gap: $promise..."
  fi
  named=0
  # shellcheck disable=SC2016  # the backquotes are the table's, literal
  for token in $(echo "$line" | grep -oE '`[A-Za-z0-9_./]+:[A-Za-z0-9_.]+`' | tr -d '`'); do
    left=${token%%:*} right=${token#*:}
    if [[ $left == */* ]]; then
      [ -f "$root/$left" ] || { fail "no file $left"; continue; }
      grep -qE "(^|[ *&])$right\(" "$root/$left" || fail "$left defines no $right()"
    else
      suite=${right%%.*} case_name=${right#*.}
      src=$(source_of "$left") || { fail "no test binary $left (percpu_cc_test)"; continue; }
      grep -qE "^(TYPED_)?TEST(_F|_P)?\($suite, $case_name\)" "$src" ||
        fail "$left has no test $suite.$case_name ($src)"
    fi
    named=$((named + 1)) tests=$((tests + 1))
  done
  for n in $(echo "$line" | grep -oE 'mutants? [0-9][0-9, and]*' | grep -oE '[0-9]+'); do
    compgen -G "$root/tests/mutants/$n-*.patch" > /dev/null ||
      compgen -G "$root/tests/mutants/0$n-*.patch" > /dev/null || fail "no mutant $n (tests/mutants/$n-*.patch)"
  done
  if [ "$named" -eq 0 ] && [[ $line != *'**gap**'* ]]; then
    fail "a row names no test and is not marked **gap**: $promise..."
  fi
done < "$table"

[ "$rows" -gt 0 ] || fail "no rows"
echo "promises.sh: $rows promises, $tests tests named, $gaps gaps"
exit $status
