#!/bin/bash
# sanitizers.sh: a user's sanitizer build against the ordinary installed
# percpu, which was built without any sanitizer.
#
#   tests/consumer/sanitizers.sh [SOURCE_DIR]
#
# Builds percpu from SOURCE_DIR (default: this checkout) with no sanitizer,
# static and shared, installs each into a temporary prefix, and builds
# sanitized.cpp (from this directory) against each install with pkg-config,
# as a user would:
#   ThreadSanitizer: clang++ and g++, static and shared;
#   AddressSanitizer: clang++ (static), g++ with UndefinedBehaviorSanitizer
#     (shared);
#   MemorySanitizer: clang++ against a percpu built with -fsanitize=memory
#     too (MSan needs every part of the program instrumented; see README,
#     "Sanitizers in your build").
# Each binary runs in three modes: rseq on glibc's area, rseq on percpu's
# own (GLIBC_TUNABLES=glibc.pthread.rseq=0) and PERCPU_BACKEND=syscall. Any
# sanitizer report (or a failed check in the program) fails the script: the
# program is correct, so every report would be a false one that percpu
# caused. Keeps the temp directory on failure and names it.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
src=$(cd "${1:-$here/../..}" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/percpu-sanitizers.XXXXXX")
trap 'status=$?; if [[ $status -eq 0 ]]; then rm -rf "$work"; else echo "sanitizers.sh: failed; left $work" >&2; fi' EXIT
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
jobs=${PERCPU_CONSUMER_JOBS:-2}

install_percpu() {  # name, extra cmake arguments...
  local name=$1; shift
  echo "== install percpu ($name) into $work/$name"
  cmake -S "$src" -B "$work/build-$name" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DBUILD_TESTING=OFF -DPERCPU_BUILD_TOOLS=OFF -DCMAKE_INSTALL_PREFIX="$work/$name" "$@" \
    >"$work/$name.configure.log" 2>&1 || { tail -30 "$work/$name.configure.log"; return 1; }
  cmake --build "$work/build-$name" -j "$jobs" >"$work/$name.build.log" 2>&1 ||
    { tail -30 "$work/$name.build.log"; return 1; }
  cmake --install "$work/build-$name" >"$work/$name.install.log" 2>&1
}

# Every sanitizer's report line; the options make each stop at the first.
reports='WARNING: ThreadSanitizer|ERROR: AddressSanitizer|ERROR: LeakSanitizer|runtime error:|WARNING: MemorySanitizer'
export TSAN_OPTIONS="halt_on_error=1 exitcode=66"
export ASAN_OPTIONS="halt_on_error=1 exitcode=66 detect_leaks=1"
export UBSAN_OPTIONS="halt_on_error=1 exitcode=66 print_stacktrace=1"
export MSAN_OPTIONS="halt_on_error=1 exitcode=66"

failures=0
runs=0

# Runs one binary in one mode and checks the mode it reports.
run_one() {  # label, binary, libdir, expected owner (glibc|percpu|any), env...
  local label=$1 binary=$2 libdir=$3 owner=$4; shift 4
  local out="$work/$label.out" status=0
  env LD_LIBRARY_PATH="$libdir" "$@" "$binary" >"$out" 2>&1 || status=$?
  # LLVM 14's TSan refuses some kernels' address-space randomisation
  # (vm.mmap_rnd_bits above 28): the run is then retried without it.
  if grep -q 'unexpected memory mapping' "$out" && command -v setarch >/dev/null; then
    status=0
    env LD_LIBRARY_PATH="$libdir" "$@" setarch "$(uname -m)" -R "$binary" >"$out" 2>&1 || status=$?
  fi
  runs=$((runs + 1))
  local why=""
  if grep -Eq "$reports" "$out"; then
    why="a sanitizer report"
  elif [[ $status -ne 0 ]]; then
    why="exit status $status"
  elif [[ $owner != any ]] && ! grep -q "rseq owner $owner: ok" "$out"; then
    why="not in the expected mode (rseq owner $owner)"
  fi
  if [[ -n $why ]]; then
    failures=$((failures + 1))
    echo "FAIL $label: $why; first report:"
    grep -E -m1 -A24 "$reports" "$out" || tail -20 "$out"
  else
    echo "ok   $label: $(tail -1 "$out")"
  fi
}

run_modes() {  # label, binary, libdir
  run_one "$1.rseq-glibc" "$2" "$3" glibc
  run_one "$1.rseq-own" "$2" "$3" percpu GLIBC_TUNABLES=glibc.pthread.rseq=0
  run_one "$1.syscall" "$2" "$3" any PERCPU_BACKEND=syscall
}

build_consumer() {  # name, prefix, compiler, flags...
  local name=$1 prefix=$2 cxx=$3; shift 3
  local pc_dir
  pc_dir=$(dirname "$(find "$prefix" -name percpu.pc -print -quit)")
  # shellcheck disable=SC2046
  "$cxx" -std=c++17 -O1 -g "$@" "$here/sanitized.cpp" \
    $(PKG_CONFIG_PATH="$pc_dir" pkg-config --cflags --libs percpu) -o "$work/$name" \
    >"$work/$name.build.log" 2>&1 || { cat "$work/$name.build.log"; return 1; }
}

install_percpu static
install_percpu shared -DBUILD_SHARED_LIBS=ON
for kind in static shared; do
  libdir=$(dirname "$(find "$work/$kind" -name 'libpercpu.*' -print -quit)")
  for cxx in clang++ g++; do
    build_consumer "tsan-$cxx-$kind" "$work/$kind" "$cxx" -fsanitize=thread
    run_modes "tsan-$cxx-$kind" "$work/tsan-$cxx-$kind" "$libdir"
  done
done
build_consumer asan-clang++-static "$work/static" clang++ -fsanitize=address
run_modes asan-clang++-static "$work/asan-clang++-static" ""
shared_libdir=$(dirname "$(find "$work/shared" -name 'libpercpu.so' -print -quit)")
build_consumer asan-ubsan-g++-shared "$work/shared" g++ -fsanitize=address,undefined
run_modes asan-ubsan-g++-shared "$work/asan-ubsan-g++-shared" "$shared_libdir"

install_percpu msan -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DCMAKE_C_FLAGS=-fsanitize=memory -DCMAKE_CXX_FLAGS=-fsanitize=memory
build_consumer msan-clang++-msan-static "$work/msan" clang++ -fsanitize=memory
run_modes msan-clang++-msan-static "$work/msan-clang++-msan-static" ""

echo "sanitized consumers: $((runs - failures)) of $runs runs clean"
[[ $failures -eq 0 ]]
