#!/usr/bin/env bash
# scripts/test.sh: builds and runs every test lane, the way CI does.
#
#   scripts/test.sh                 every lane, in order
#   scripts/test.sh --lane NAME...  only the named lanes (repeatable)
#   scripts/test.sh --list          the lanes and what each covers
#
# Each lane builds in build/lanes/NAME, prints what it covered and its wall
# time (its output is kept in build/lanes/NAME.lane.log too), and the
# script ends with, for each failed lane, the lines of that log that say
# what failed, then one summary line per lane and a final "lanes: N passed,
# M failed" line. Any failing lane fails the script.
# PERCPU_STRESS_SCALE (default 1) lengthens the stress tests for soaking.
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
jobs=$(nproc 2>/dev/null || echo 2)
export PERCPU_STRESS_SCALE=${PERCPU_STRESS_SCALE:-1}
export CTEST_OUTPUT_ON_FAILURE=1

all_lanes=(default clang asan-ubsan tsan valgrind rseq-off seams aarch64-user vm-fetch aarch64-system kernels warnings consumer subproject package mutants)
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
    vm-fetch) echo "the VM lanes' package fetcher against local broken suites (truncated index, unreachable mirror), offline" ;;
    aarch64-system) echo "aarch64 static tests in an initramfs on Debian's arm64 kernel, qemu-system -smp 2 (real rseq)" ;;
    kernels) echo "Debian kernels 5.10-7.3 (x86-64 TCG, arm64) x glibc 2.36-2.44 x rseq modes; writes docs/compatibility.md" ;;
    warnings) echo "-Wall -Wextra -Werror with g++ and clang (done by default/clang), and percpu.h compiled as C" ;;
    consumer) echo "install the shared library and build a consumer with find_package and pkg-config; TSan/ASan/MSan consumers of the uninstrumented install; aarch64 cross install" ;;
    subproject) echo "a parent project with include(CTest) takes percpu by add_subdirectory, FetchContent, find_package: no percpu test, target or build type in it" ;;
    package) echo "the Debian packages (cpack): dpkg -i, a consumer with find_package and pkg-config, dpkg --purge leaves nothing; abidiff against abi/libpercpu.abi" ;;
    mutants) echo "each deliberate bug in tests/mutants/*.patch, planted in a scratch copy (clang++): the tests named for it must fail" ;;
  esac
}

lanes=()
while [ $# -gt 0 ]; do
  case "$1" in
    --lane) [ $# -ge 2 ] || { echo "test.sh: --lane needs a name (see --list)" >&2; exit 2; }
            lanes+=("$2"); shift 2 ;;
    --list) for l in "${all_lanes[@]}"; do printf '  %-15s %s\n' "$l" "$(describe "$l")"; done; exit 0 ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
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
    clang|warnings|mutants|consumer) groups+=(clang) ;;
    valgrind) groups+=(valgrind) ;;
    aarch64-*|kernels) groups+=(aarch64) ;;
    package) groups+=(abi) ;;
  esac
done
groups+=(allocators sync aarch64)  # benchmarks link the allocators, TBB and liburcu; the aarch64 probe is always checked
groups+=(gbench-tools)  # percpu_bench_test reads percpu-bench's Google Benchmark JSON with compare.py
"$root/scripts/deps.sh" "${groups[@]}" || exit 1

# What the host offers, printed first so that a failure report says where it
# ran: the tests check percpu's documented behaviour for what is here, never
# assume it (tests/support/expected_backend.hpp).
"$root/scripts/host_report.sh"

# The RDPID backend is tested on every host, under an emulated CPU that has
# the instruction (the *.emulated_rdpid variants): Debian trixie's qemu-user
# (qemu 10; bookworm's 7.2 faults on RDPID), fetched once into the VM lanes'
# cache. PERCPU_X86_64_EMULATOR set beforehand names another.
if [ "$(uname -m)" = x86_64 ] && [ -z "${PERCPU_X86_64_EMULATOR:-}" ]; then
  if PERCPU_X86_64_EMULATOR=$("$root/scripts/lanes/vm/fetch.sh" "${VM_CACHE:-$root/build/kernels-cache}" \
                                qemu-user amd64 trixie,sid); then
    export PERCPU_X86_64_EMULATOR
    echo "RDPID variants: under $PERCPU_X86_64_EMULATOR -cpu max ($("$PERCPU_X86_64_EMULATOR" --version | head -n1))"
  else
    echo "test.sh: cannot fetch trixie's qemu-user for the RDPID variants (fetch.sh said why above)" >&2
    exit 1
  fi
fi

# The build and test configurations of the lanes that run ctest live in
# CMakePresets.json (one configure, build and test preset per lane, building
# in build/lanes/NAME), and choose tests by ctest label (the list is in
# cmake/percpu_helpers.cmake); each test preset's description says why it
# leaves out what it does. A contributor runs the same without this script:
#   cmake --preset asan-ubsan && cmake --build --preset asan-ubsan && ctest --preset asan-ubsan
configure_and_build() {  # preset
  local log="$root/build/lanes/$1"
  (cd "$root" && cmake --preset "$1") >"$log.configure.log" 2>&1 || { cat "$log.configure.log"; return 1; }
  (cd "$root" && cmake --build --preset "$1" -j "$jobs") >"$log.build.log" 2>&1 ||
    { tail -60 "$log.build.log"; return 1; }
}

run_ctest() {  # test preset, [command that wraps ctest...]
  local preset=$1; shift
  (cd "$root" && "$@" ctest --preset "$preset" -j "$jobs")
}

preset_lane() {  # the lane's presets: configure, build, test
  configure_and_build "$1" && run_ctest "$1"
}

lane_default() { preset_lane default; }
lane_clang() { preset_lane clang; }
lane_asan-ubsan() { preset_lane asan-ubsan; }
# -Wno-tsan (in the preset): GCC warns that TSan does not model standalone
# fences; the fence in cpu_slots.cpp orders sections against lockers, and no
# section runs on this lane's fallback paths.
lane_tsan() { preset_lane tsan; }
lane_valgrind() { preset_lane valgrind; }

lane_rseq-off() {
  # The default lane's build (already built when both run): only the
  # environment differs.
  configure_and_build default || return 1
  local status=0
  echo "--- rseq-off: GLIBC_TUNABLES=glibc.pthread.rseq=0 (percpu registers its own areas)"
  run_ctest rseq-off || status=1
  for error in ENOSYS EPERM; do
    echo "--- rseq-off: seccomp makes rseq fail with $error (fallbacks)"
    run_ctest rseq-off-seccomp "$root/build/lanes/default/tests/seccomp_exec" "$error" || status=1
  done
  return $status
}

lane_seams() {
  local status=0 seam
  for seam in delays compare-twice; do
    echo "--- seams: $seam"
    preset_lane "seams-$seam" || status=1
  done
  return $status
}

lane_aarch64-user() {
  (cd "$root" && AARCH64_USER_BUILD_DIR="$B" scripts/lanes/aarch64-user.sh)
}
lane_vm-fetch() { "$root/scripts/lanes/vm/fetch_test.sh" "$B"; }
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
  echo "--- consumer: sanitizers in the user's build (TSan, ASan+UBSan, MSan) against the uninstrumented install"
  "$root/tests/consumer/sanitizers.sh" "$root" || return 1
  echo "--- consumer: aarch64 cross build and install, BUILD_TESTING=OFF, PERCPU_BUILD_TOOLS=OFF"
  cmake -S "$root" -B "$B/aarch64" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF \
    -DPERCPU_BUILD_TOOLS=OFF -DCMAKE_SYSTEM_NAME=Linux -DCMAKE_SYSTEM_PROCESSOR=aarch64 \
    -DCMAKE_C_COMPILER=aarch64-linux-gnu-gcc -DCMAKE_CXX_COMPILER=aarch64-linux-gnu-g++ \
    -DCMAKE_INSTALL_PREFIX="$B/aarch64/prefix" >"$B.aarch64.log" 2>&1 &&
    cmake --build "$B/aarch64" -j "$jobs" >>"$B.aarch64.log" 2>&1 &&
    cmake --install "$B/aarch64" >>"$B.aarch64.log" 2>&1 || { tail -30 "$B.aarch64.log"; return 1; }
  local formats
  formats=$(aarch64-linux-gnu-objdump -f "$B/aarch64/prefix/lib/libpercpu.a") &&
    grep -q 'aarch64' <<<"$formats" &&
    ls "$B/aarch64/prefix/lib/cmake/percpu/percpuConfig.cmake" "$B/aarch64/prefix/include/percpu/cpu.hpp" &&
    echo "aarch64 install: ok"
}

# A parent project (tests/subproject) that takes percpu in three ways, by
# docs/adopting.md's recipes; library builds only.
lane_subproject() {
  "$root/tests/subproject/run.sh" "$B"
}

lane_package() {
  (cd "$root" && PACKAGE_BUILD_DIR="$B" scripts/lanes/package.sh)
}

# One scratch copy and one build directory kept between runs, so each mutant
# rebuilds only what its patch touches (scripts/mutants.sh; DEVELOPERS.md says
# how to add one).
lane_mutants() {
  "$root/scripts/mutants.sh" "$B"
}

mkdir -p "$root/build/lanes"
summary=() failed_lanes=()
passed=0 failed=0
for lane in "${lanes[@]}"; do
  B="$root/build/lanes/$lane"
  echo "=== lane $lane: $(describe "$lane")"
  start=$(date +%s)
  # Each lane's output is kept in build/lanes/NAME.lane.log as well, so that
  # the end of the run can say again why a lane failed: CI's report keeps
  # only the last lines, which belong to later lanes.
  "lane_$lane" 2>&1 | tee "$root/build/lanes/$lane.lane.log"
  if [ "${PIPESTATUS[0]}" -eq 0 ]; then
    result=passed; passed=$((passed + 1))
  else
    result=FAILED; failed=$((failed + 1)); failed_lanes+=("$lane")
  fi
  seconds=$(( $(date +%s) - start ))
  echo "=== lane $lane: $result in ${seconds}s"
  summary+=("$(printf '%-15s %-7s %5ss' "$lane" "$result" "$seconds")")
done

# The lines of a failed lane's log that say what failed (ctest's and gtest's
# failures, the VM lanes' FAILED lines, compiler errors, timeouts, killed
# mutants that survived), at most 40 per lane.
why_failed() {  # lane
  grep -E 'FAILED|\*\*\*Failed|\*\*\*Timeout|\*\*\*Exception|Failed +[0-9.]+ sec|error:|SURVIVED|survived|no summary|did not finish|did not reach init|qemu_exit [1-9]| - .* \((Failed|Timeout|SEGFAULT|Subprocess aborted|Child aborted|Exception|Not Run)\)$' \
    "$root/build/lanes/$1.lane.log" | grep -vE '^=== lane |, 0 failed' | tail -n 40
}
for lane in "${failed_lanes[@]}"; do
  echo
  echo "Why lane $lane failed (from build/lanes/$lane.lane.log):"
  why_failed "$lane" | sed 's/^/  | /'
done

echo
echo "Lane summary:"
for line in "${summary[@]}"; do echo "  $line"; done
echo "lanes: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
