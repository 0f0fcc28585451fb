#!/usr/bin/env bash
# scripts/test.sh: builds and runs every test lane, the way CI does.
#
#   scripts/test.sh                 every lane, in order
#   scripts/test.sh --lane NAME...  only the named lanes (repeatable)
#   scripts/test.sh --list          the lanes and what each covers
#
# Each lane builds in build/lanes/NAME, prints what it covered and its wall
# time, and the script ends with one summary line per lane and a final
# "lanes: N passed, M failed" line. Any failing lane fails the script.
# PERCPU_STRESS_SCALE (default 1) lengthens the stress tests for soaking.
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
jobs=$(nproc 2>/dev/null || echo 2)
export PERCPU_STRESS_SCALE=${PERCPU_STRESS_SCALE:-1}
export CTEST_OUTPUT_ON_FAILURE=1

all_lanes=(default clang asan-ubsan tsan valgrind rseq-off seams aarch64-user aarch64-system kernels warnings consumer mutants)
describe() {
  case "$1" in
    default) echo "g++, Release with assertions, -Werror: the whole ctest suite (every mode variant)" ;;
    clang) echo "clang++ as C++20, Release with assertions, -Werror: the whole ctest suite" ;;
    asan-ubsan) echo "g++ with AddressSanitizer and UndefinedBehaviorSanitizer: the whole suite" ;;
    tsan) echo "g++ with ThreadSanitizer: the whole suite on percpu's fallback paths (PERCPU_BACKEND=syscall)" ;;
    valgrind) echo "valgrind memcheck on the core and structure tests (rseq is ENOSYS there: fallbacks)" ;;
    rseq-off) echo "the whole suite with glibc's rseq off, then under seccomp rseq=ENOSYS, then rseq=EPERM" ;;
    seams) echo "structure tests built with PERCPU_INJECT_DELAYS, then with PERCPU_COMPARE_TWICE" ;;
    aarch64-user) echo "aarch64 cross build under qemu-user (fallback paths)" ;;
    aarch64-system) echo "aarch64 static tests in an initramfs on Debian's arm64 kernel, qemu-system -smp 2 (real rseq)" ;;
    kernels) echo "Debian kernels 5.10-7.3 (x86-64 TCG, arm64) x glibc 2.36-2.44 x rseq modes; writes docs/compatibility.md" ;;
    warnings) echo "-Wall -Wextra -Werror with g++ and clang (done by default/clang), and percpu.h compiled as C" ;;
    consumer) echo "install the shared library and build a consumer with find_package and pkg-config; aarch64 cross install" ;;
    mutants) echo "each deliberate bug in tests/mutants/*.patch, planted in a scratch copy (clang++): the tests named for it must fail" ;;
  esac
}

lanes=()
while [ $# -gt 0 ]; do
  case "$1" in
    --lane) [ $# -ge 2 ] || { echo "test.sh: --lane needs a name (see --list)" >&2; exit 2; }
            lanes+=("$2"); shift 2 ;;
    --list) for l in "${all_lanes[@]}"; do printf '  %-15s %s\n' "$l" "$(describe "$l")"; done; exit 0 ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "test.sh: unknown argument '$1' (try --list or --help)" >&2; exit 2 ;;
  esac
done
[ ${#lanes[@]} -gt 0 ] || lanes=("${all_lanes[@]}")
for l in "${lanes[@]}"; do
  [ -n "$(describe "$l")" ] || { echo "test.sh: unknown lane '$l' (see --list)" >&2; exit 2; }
done

# Every lane needs the build tools; some need more.
groups=(build)
for l in "${lanes[@]}"; do
  case "$l" in
    clang|warnings|mutants) groups+=(clang) ;;
    valgrind) groups+=(valgrind) ;;
    aarch64-*|kernels) groups+=(aarch64) ;;
  esac
done
groups+=(allocators sync aarch64)  # benchmarks link the allocators, TBB and liburcu; the aarch64 probe is always checked
"$root/scripts/deps.sh" "${groups[@]}" || exit 1

configure_and_build() {  # dir, cmake args...
  local dir=$1; shift
  cmake -S "$root" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DPERCPU_KEEP_ASSERTS=ON \
        -DPERCPU_WERROR=ON -DPERCPU_REQUIRE_AARCH64_PROBE=ON "$@" >"$dir.configure.log" 2>&1 ||
    { cat "$dir.configure.log"; return 1; }
  cmake --build "$dir" -j "$jobs" >"$dir.build.log" 2>&1 || { tail -60 "$dir.build.log"; return 1; }
}

run_ctest() {  # dir, ctest args...
  local dir=$1; shift
  (cd "$dir" && ctest -j "$jobs" --timeout 900 "$@")
}

lane_default() {
  configure_and_build "$B" && run_ctest "$B"
}

lane_clang() {
  configure_and_build "$B" -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
    -DCMAKE_CXX_STANDARD=20 && run_ctest "$B"
}

lane_asan-ubsan() {
  local flags="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
  configure_and_build "$B" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPERCPU_BUILD_BENCHMARKS=OFF \
    "-DCMAKE_C_FLAGS=$flags" "-DCMAKE_CXX_FLAGS=$flags" \
    "-DCMAKE_EXE_LINKER_FLAGS=-fsanitize=address,undefined" \
    "-DCMAKE_SHARED_LINKER_FLAGS=-fsanitize=address,undefined" &&
    ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
      run_ctest "$B" -E 'fast_path|preload'
  # Excluded: fast_path (instrumented code is not the shape users get) and the
  # preload test (ASan's runtime must come first in a process's libraries, so
  # an LD_PRELOAD'ed instrumented library cannot start); both run in the
  # default and clang lanes.
}

lane_tsan() {
  # TSan cannot see the kernel restarting a critical section, so it would
  # misread the per-CPU slots' plain stores. On the fallback every shared
  # write is an atomic it understands. Mode variants that demand rseq, the
  # other-registrant tests (they share a registered area's sections) and the
  # preload test (TSan's runtime cannot be preloaded under) are excluded.
  # The fork-under-load stress cases are left to the other lanes: TSan's
  # runtime cannot start threads in the child of a multithreaded fork.
  # -Wno-tsan: GCC warns that TSan does not model standalone fences; the
  # fence in slot_lock.cpp orders sections against lockers, and no section
  # runs on this lane's fallback paths.
  configure_and_build "$B" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPERCPU_BUILD_BENCHMARKS=OFF \
    "-DCMAKE_C_FLAGS=-fsanitize=thread" "-DCMAKE_CXX_FLAGS=-fsanitize=thread -Wno-tsan" \
    "-DCMAKE_EXE_LINKER_FLAGS=-fsanitize=thread" "-DCMAKE_SHARED_LINKER_FLAGS=-fsanitize=thread" &&
    PERCPU_BACKEND=syscall TSAN_OPTIONS=halt_on_error=1 GTEST_FILTER='-*ForkDuringHeavyUse' \
      run_ctest "$B" -E '\.(glibc|own)$|forced_|seccomp_eperm|preload|fast_path|consumer|example|foreign_rseq'
}

# --fair-sched: valgrind runs one thread at a time, and its default lock lets
# twelve busy workers starve the thread that would stop them.
# The fork-under-load stress cases (ForkDuringHeavyUse, ForkWhile*) run in
# every other lane, not here: a child forked from busy threads loses their
# stacks, so what only they pointed to (their std::thread states) reads as
# definitely lost in the child. Also left out: foreign_rseq_* (another
# registrant needs rseq, which valgrind lacks) and the static early-use test
# (memcheck reports static glibc's own loader code, which percpu's pin of its
# object calls, and a static program's malloc is not valgrind's to check).
lane_valgrind() {
  configure_and_build "$B" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPERCPU_BUILD_BENCHMARKS=OFF \
    -DPERCPU_TEST_TIMEOUT=1500 "-DPERCPU_TEST_LAUNCHER=valgrind;--fair-sched=yes;--error-exitcode=97;--leak-check=full;--errors-for-leak-kinds=definite;-q" &&
    PERCPU_UNDER_VALGRIND=1 PERCPU_STRESS_SCALE=0.2 GTEST_FILTER='-*ForkDuringHeavyUse:*ForkWhile*' \
      run_ctest "$B" -L 'core|structures' -E '\.(glibc|own|fallback)$|forced_|seccomp_eperm|fast_path|foreign_rseq|early_use_test_static'
}

lane_rseq-off() {
  # The same build as the default lane's (built there already when both run):
  # only the environment differs.
  B="$root/build/lanes/default"
  configure_and_build "$B" || return 1
  local seccomp="$B/tests/seccomp_exec" status=0
  echo "--- rseq-off: GLIBC_TUNABLES=glibc.pthread.rseq=0 (percpu registers its own areas)"
  # The preload tests and the other-registrant tests are left out here:
  # each sets up the mode it needs itself (the preload's probe runs in each
  # mode; foreign_rseq_* needs a kernel with rseq and glibc's off, with a
  # registrant of its own in the process).
  GLIBC_TUNABLES=glibc.pthread.rseq=0 PERCPU_EXPECT_OWNER=percpu \
    run_ctest "$B" -E '\.(glibc|fallback)$|forced_|seccomp_eperm|preload|foreign_rseq' || status=1
  for error in ENOSYS EPERM; do
    echo "--- rseq-off: seccomp makes rseq fail with $error (fallbacks)"
    PERCPU_EXPECT_OWNER=none "$seccomp" "$error" \
      ctest --test-dir "$B" -j "$jobs" --timeout 900 -E '\.(glibc|own)$|forced_|preload|foreign_rseq' || status=1
  done
  return $status
}

lane_seams() {
  local status=0
  for seam in PERCPU_INJECT_DELAYS PERCPU_COMPARE_TWICE; do
    echo "--- seams: $seam"
    local dir="$B-$seam"
    configure_and_build "$dir" -D$seam=ON -DPERCPU_BUILD_BENCHMARKS=OFF -DPERCPU_BUILD_TOOLS=OFF \
      -DPERCPU_BUILD_EXAMPLES=OFF && PERCPU_STRESS_SCALE=0.5 run_ctest "$dir" -L structures || status=1
  done
  return $status
}

lane_aarch64-user() {
  (cd "$root" && AARCH64_USER_BUILD_DIR="$B" scripts/lanes/aarch64-user.sh)
}
lane_aarch64-system() {
  (cd "$root" && AARCH64_SYSTEM_BUILD_DIR="$B" scripts/lanes/aarch64-system.sh)
}
lane_kernels() {
  (cd "$root" && KERNELS_BUILD_DIR="$B" scripts/lanes/kernels.sh)
}

lane_warnings() {
  # The C header must compile as strict C on its own, with both compilers.
  local cc status=0
  for cc in gcc clang; do
    echo '#include "percpu/percpu.h"
int main(void) { return percpu_cpu_id() < 0; }' |
      $cc -std=c99 -pedantic -Wall -Wextra -Werror -I"$root" -x c -c - -o /dev/null || status=1
    echo "percpu.h as C99 with $cc: $([ $status -eq 0 ] && echo ok || echo FAILED)"
  done
  echo "(-Wall -Wextra -Werror on all of percpu's own code: the default lane builds with g++, the clang lane with clang++)"
  return $status
}

lane_consumer() {
  # The static build's consumers run in the default lane's ctest; here the
  # shared library, then a library-only cross build for aarch64 that must
  # need nothing but the cross compiler and CMake.
  echo "--- consumer: shared library"
  "$root/tests/consumer/run.sh" "$root" -DBUILD_SHARED_LIBS=ON || return 1
  echo "--- consumer: aarch64 cross build and install, BUILD_TESTING=OFF, PERCPU_BUILD_TOOLS=OFF"
  cmake -S "$root" -B "$B/aarch64" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF \
    -DPERCPU_BUILD_TOOLS=OFF -DCMAKE_SYSTEM_NAME=Linux -DCMAKE_SYSTEM_PROCESSOR=aarch64 \
    -DCMAKE_C_COMPILER=aarch64-linux-gnu-gcc -DCMAKE_CXX_COMPILER=aarch64-linux-gnu-g++ \
    -DCMAKE_INSTALL_PREFIX="$B/aarch64/prefix" >"$B.aarch64.log" 2>&1 &&
    cmake --build "$B/aarch64" -j "$jobs" >>"$B.aarch64.log" 2>&1 &&
    cmake --install "$B/aarch64" >>"$B.aarch64.log" 2>&1 || { tail -30 "$B.aarch64.log"; return 1; }
  aarch64-linux-gnu-objdump -f "$B/aarch64/prefix/lib/libpercpu.a" | grep -q 'aarch64' &&
    ls "$B/aarch64/prefix/lib/cmake/percpu/percpuConfig.cmake" "$B/aarch64/prefix/include/percpu/cpu.hpp" &&
    echo "aarch64 install: ok"
}

# One scratch copy and one build directory kept between runs, so each mutant
# rebuilds only what its patch touches (scripts/mutants.sh; DEVELOPERS.md says
# how to add one).
lane_mutants() {
  "$root/scripts/mutants.sh" "$B"
}

mkdir -p "$root/build/lanes"
summary=()
passed=0 failed=0
for lane in "${lanes[@]}"; do
  B="$root/build/lanes/$lane"
  echo "=== lane $lane: $(describe "$lane")"
  start=$(date +%s)
  if "lane_$lane"; then result=passed; passed=$((passed + 1)); else result=FAILED; failed=$((failed + 1)); fi
  seconds=$(( $(date +%s) - start ))
  echo "=== lane $lane: $result in ${seconds}s"
  summary+=("$(printf '%-15s %-7s %5ss' "$lane" "$result" "$seconds")")
done

echo
echo "Lane summary:"
for line in "${summary[@]}"; do echo "  $line"; done
echo "lanes: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
