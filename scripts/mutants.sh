#!/usr/bin/env bash
# scripts/mutants.sh: plants each deliberate bug in tests/mutants/*.patch in a
# scratch copy of the tree, rebuilds only what the patch names, runs only the
# tests that must catch it, and fails if any mutant survives, no longer
# applies, or no longer builds. Prints a table mutant -> test that caught it.
#
#   scripts/mutants.sh [WORK_DIR] [PATCH...]
#
# WORK_DIR (default build/lanes/mutants) keeps the scratch copy (src/) and one
# build directory (build/) between runs, so a run rebuilds little: the copy is
# refreshed file by file, only files that differ are rewritten, and each patch
# is reverted after use. PATCH... limits the run to those patches.
#
# Each patch opens with header lines that patch(1) ignores:
#   Breaks: one line: the promise this bug breaks
#   Build:  the binaries to rebuild (space-separated), by file name; their
#           CMake targets are percpu_NAME (see cmake/percpu_helpers.cmake)
#   Tests:  a ctest -R regex: the tests that must fail
#   Filter: (optional) a GTEST_FILTER for those tests, to run only the cases
#           that matter
# Patches are x86-64 ones (the sections' asm is per architecture); the build
# uses clang++: with a non-volatile thread pointer (mutant 11) clang++ keeps
# the old thread's value across a coroutine's resumption and a fiber switch,
# and every resume_elsewhere_test case fails; g++ 12 keeps it only across the
# fiber switch, so only the fiber case catches it there.
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
work=${1:-$root/build/lanes/mutants}
shift || true
mkdir -p "$work" && work=$(cd "$work" && pwd)
src=$work/src
build=$work/build
jobs=${PERCPU_MUTANT_JOBS:-$(nproc 2>/dev/null || echo 2)}
mkdir -p "$src" "$build"

if [ "$(uname -m)" != x86_64 ]; then
  echo "mutants: the patches are for x86-64; this is $(uname -m)" >&2
  exit 1
fi

patches=()
if [ $# -gt 0 ]; then
  for p in "$@"; do patches+=("$(cd "$(dirname "$p")" && pwd)/$(basename "$p")"); done
else
  for p in "$root"/tests/mutants/*.patch; do patches+=("$p"); done
fi
[ ${#patches[@]} -gt 0 ] || { echo "mutants: no patches in tests/mutants" >&2; exit 1; }

field() {  # patch, header name: the value of that header line
  sed -n "s/^$2: //p;/^--- /q" "$1" | head -1
}

# Binary names to their CMake targets: percpu_NAME, or NAME when it already
# starts with "percpu" (percpu_target() in cmake/percpu_helpers.cmake).
targets_of() {
  local name
  for name in "$@"; do
    case "$name" in percpu|percpu_*|percpu-*) echo "$name" ;; *) echo "percpu_$name" ;; esac
  done
}

# The scratch copy: every tracked file as it is in the working tree. Files
# already identical keep their timestamps, so ninja rebuilds only what changed.
sync_copy() {
  (cd "$root" && git ls-files -z --cached) | while IFS= read -r -d '' f; do
    [ -f "$root/$f" ] || continue
    if ! cmp -s "$root/$f" "$src/$f"; then
      mkdir -p "$(dirname "$src/$f")"
      cp -p "$root/$f" "$src/$f"
      touch "$src/$f"
    fi
  done
}

applied=""
revert() {
  if [ -n "$applied" ]; then
    (cd "$src" && patch -p1 -R -s -F0 --no-backup-if-mismatch <"$applied" >/dev/null) ||
      echo "mutants: could not revert $(basename "$applied"); the next run re-copies" >&2
    applied=""
  fi
}
trap revert EXIT

start=$(date +%s)
echo "--- mutants: scratch copy in $src"
sync_copy
# PERCPU_X86_64_EMULATOR (scripts/test.sh fetches one) registers the
# *.emulated variants, which catch the RDPID mutants on a CPU without RDPID.
# Passed on every run, so a kept build follows the current value.
if [ ! -f "$build/build.ninja" ]; then
  cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DPERCPU_KEEP_ASSERTS=ON \
    -DPERCPU_WERROR=ON -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
    -DCMAKE_CXX_STANDARD=20 -DPERCPU_BUILD_BENCHMARKS=OFF -DPERCPU_BUILD_EXAMPLES=OFF \
    -DPERCPU_X86_64_EMULATOR="${PERCPU_X86_64_EMULATOR:-}" \
    >"$work/configure.log" 2>&1 || { cat "$work/configure.log"; exit 1; }
else
  cmake "$build" -DPERCPU_X86_64_EMULATOR="${PERCPU_X86_64_EMULATOR:-}" >"$work/configure.log" 2>&1 ||
    { cat "$work/configure.log"; exit 1; }
fi

# Baseline: every named target builds and every named test passes on the
# unmutated tree, so a failure below is the mutant's doing.
targets="" tests=""
for p in "${patches[@]}"; do
  # shellcheck disable=SC2046
  targets="$targets $(targets_of $(field "$p" Build))"
  tests="${tests:+$tests|}$(field "$p" Tests)"
done
echo "--- mutants: baseline build ($(echo $targets | wc -w) targets) and tests"
# shellcheck disable=SC2086
cmake --build "$build" -j "$jobs" --target $targets >"$work/baseline.log" 2>&1 ||
  { tail -40 "$work/baseline.log"; echo "mutants: the unmutated tree does not build" >&2; exit 1; }
(cd "$build" && ctest -j "$jobs" --timeout 300 -R "$tests" >"$work/baseline-tests.log" 2>&1) ||
  { tail -40 "$work/baseline-tests.log"; echo "mutants: tests fail without any mutant" >&2; exit 1; }

rows=() failures=0
for p in "${patches[@]}"; do
  name=$(basename "$p" .patch)
  breaks=$(field "$p" Breaks)
  # shellcheck disable=SC2046
  build_targets=$(targets_of $(field "$p" Build))
  regex=$(field "$p" Tests)
  filter=$(field "$p" Filter)
  log="$work/$name.log"
  t0=$(date +%s)
  if [ -z "$breaks" ] || [ -z "$build_targets" ] || [ -z "$regex" ]; then
    result="BAD HEADER (needs Breaks:, Build:, Tests:)"
  elif ! (cd "$src" && patch -p1 --dry-run -s -F0 <"$p" >"$log" 2>&1); then
    result="NO LONGER APPLIES: refresh it"
  else
    (cd "$src" && patch -p1 -s -F0 --no-backup-if-mismatch <"$p" >>"$log" 2>&1)
    applied=$p
    # shellcheck disable=SC2086
    if ! cmake --build "$build" -j "$jobs" --target $build_targets >>"$log" 2>&1; then
      result="DOES NOT BUILD: refresh it"
    else
      # A mutant is killed by its first failure: gtest stops a binary at its
      # first failed case and ctest starts no test after a failed one.
      (cd "$build" && GTEST_FILTER=${filter:-*} GTEST_FAIL_FAST=1 ctest -j "$jobs" --timeout 120 \
         --stop-on-failure -R "$regex" --output-on-failure >>"$log" 2>&1)
      status=$?
      caught=$(sed -n 's/^[[:space:]]*[0-9]* - \([^ ]*\) (.*)$/\1/p' "$log" | sort -u | tr '\n' ' ')
      if [ $status -ne 0 ] && [ -n "$caught" ]; then
        cases=$(grep -o '^\[  FAILED  \] [A-Za-z0-9_/]*\.[A-Za-z0-9_/]*' "$log" |
                awk '{print $4}' | sort -u | head -3 | tr '\n' ' ')
        result="killed by ${caught% }${cases:+ (${cases% })}"
      elif grep -q "No tests were found" "$log"; then
        result="NO TESTS MATCH '$regex': refresh it"
      else
        result="SURVIVED"
      fi
    fi
    revert
  fi
  case "$result" in killed*) ;; *) failures=$((failures + 1)) ;; esac
  rows+=("$(printf '%-28s %4ss  %s' "$name" "$(( $(date +%s) - t0 ))" "$result")")
  echo "${rows[-1]}"
  [ "${result#killed}" = "$result" ] && echo "    ($breaks; log: $log)"
done

echo
echo "Mutant                        time  result (ctest test, gtest cases)"
for r in "${rows[@]}"; do echo "  $r"; done
echo "mutants: $(( ${#patches[@]} - failures )) of ${#patches[@]} killed in $(( $(date +%s) - start ))s"
[ $failures -eq 0 ]
