#!/usr/bin/env bash
# The kernels lane: percpu on every kernel and glibc that changed rseq.
#
# Boots Debian's cloud kernels (5.10 bullseye, 6.1 bookworm, 6.12 trixie, 7.2
# sid, 7.3-rc experimental) for x86-64 (qemu-system-x86_64 -accel tcg -cpu max
# -smp 2: KVM does not work for these guests here) and arm64
# (qemu-system-aarch64 -M virt -cpu max -smp 2), each with an initramfs whose
# /init is the aarch64-system lane's (scripts/lanes/vm/init.sh). In every
# VM the rseq-relevant suites run statically linked against the build's glibc,
# in each mode: glibc-owned, percpu's own registration, and the fallback
# (seccomp makes rseq ENOSYS). On the kernels in DYNAMIC_SUITES, and on this
# machine's kernel, the same tests also run dynamically linked under each
# Debian glibc, started through that glibc's own loader
# (ld-linux-*.so --library-path ...), plus the tests with another rseq
# registrant in the process. 7.2 boots with rseq_debug=1, where the kernel
# kills a task that writes a field it owns or makes a system call inside a
# critical section.
#
# It prints a table kernel x glibc x arch (result, rseq owner, registration
# length and mode, feature size, backend, sections) and writes it to
# docs/compatibility.md with the date and commit. It fails on any failed run,
# and on any run that should have had rseq and did not.
#
# Packages come through a private apt configuration (scripts/lanes/vm/fetch.sh),
# cached in build/kernels-cache (or VM_CACHE): a fresh machine downloads each
# one once.
#
# Settings (environment):
#   KERNELS_BUILD_DIR     build directory (default build/lanes/kernels)
#   KERNELS_SUITES        Debian suites whose x86-64 kernels boot (default: all five)
#   KERNELS_AARCH64_SUITES  the same for arm64 (default: sid experimental, the
#                         7.x kernels; bookworm's 6.1 is the aarch64-system
#                         lane's, and each arm64 VM costs minutes under TCG,
#                         so the default keeps the lane inside CI's budget;
#                         docs/compatibility.md is made with all five)
#   KERNELS_ARCHES        x86_64 and/or aarch64 (default: both)
#   KERNELS_NO_DOC        set to leave docs/compatibility.md alone (a run
#                         with fewer arm64 kernels than x86-64 ones always
#                         does, and writes its table in the build directory)
#   KERNELS_TESTS         the static suites to run (default: all of
#                         STATIC_SUITES below), to chase one test's failure
#   KERNELS_REPEAT        start each static suite this many times in a row
#                         (separate processes: the suites' cases on global
#                         objects cannot run twice in one; default 1); with
#                         KERNELS_TESTS, how
#                         a failure seen once in CI is reproduced in a VM
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUILD=${KERNELS_BUILD_DIR:-$REPO/build/lanes/kernels}
case $BUILD in /*) ;; *) BUILD=$REPO/$BUILD ;; esac
SUITES=(${KERNELS_SUITES:-bullseye bookworm trixie sid experimental})
AARCH64_SUITES=(${KERNELS_AARCH64_SUITES:-sid experimental})
suites_for() { if [[ $1 == aarch64 ]]; then echo "${AARCH64_SUITES[@]}"; else echo "${SUITES[@]}"; fi; }
ARCHES=(${KERNELS_ARCHES:-x86_64 aarch64})
# Kernels that also run the dynamic glibc matrix and the other-registrant tests.
DYNAMIC_SUITES=(bookworm sid)
# glibcs for the dynamic runs. bullseye's 2.31 cannot load binaries built
# against this machine's 2.36 (they need GLIBC_2.34 symbols); its case (no
# rseq in glibc, percpu registers) is what the own-registration runs cover.
GLIBC_SUITES=(bookworm trixie sid experimental)
# The kernel whose runs happen under rseq_debug=1.
DEBUG_SUITE=sid
STATIC_SUITES=(cpu_test rseq_cs_test counter_test free_list_test object_pool_test per_cpu_test)
[[ -n ${KERNELS_TESTS:-} ]] && STATIC_SUITES=(${KERNELS_TESTS})
REPEAT=${KERNELS_REPEAT:-1}
# Only per_cpu<T>'s cases by concurrency id run here (their section reads
# mm_cid, which 5.10 does not keep, or the CPU id where it does not); its
# by-CPU cases run the sections counter_test already covers.
PER_CPU_FILTER='CidPerCpu*:*/ById.*'
DYNAMIC_TESTS=(cpu_test counter_test)
FOREIGN_TESTS=(foreign_rseq_librseq_test foreign_rseq_abi_test)
# Long enough for the stress tests' helper threads (affinity flippers) to act
# under TCG, short enough for ten VMs.
STRESS_SCALE=0.2
LANE=kernels
source "$REPO/scripts/lanes/lib.sh"
lane_start=$(date +%s)

need_packages qemu-system-x86 qemu-system-arm g++-aarch64-linux-gnu cpio cmake ninja-build googletest gzip python3

# --- Kernels and glibcs --------------------------------------------------
fetch_start=$(date +%s)
declare -A KERNEL GLIBC
for arch in "${ARCHES[@]}"; do
  for suite in $(suites_for "$arch"); do
    KERNEL[$arch-$suite]=$(fetch kernel "$(debarch "$arch")" "$suite")
  done
  for suite in "${GLIBC_SUITES[@]}"; do
    GLIBC[$arch-$suite]=$(fetch libc6 "$(debarch "$arch")" "$suite")
  done
done
say "packages ready ($(($(date +%s) - fetch_start))s)"

# --- Builds: static and dynamic, per arch --------------------------------
build_start=$(date +%s)
build() {  # arch kind -> directory
  local arch=$1 kind=$2 dir=$BUILD/$1-$2 args=()
  [[ $arch == aarch64 ]] && args+=(-DCMAKE_TOOLCHAIN_FILE="$REPO/cmake/toolchains/aarch64-linux-gnu.cmake"
                                   -DCMAKE_CROSSCOMPILING_EMULATOR=)
  [[ $kind == static ]] && args+=(-DCMAKE_EXE_LINKER_FLAGS=-static)
  local targets=(seccomp_exec "${STATIC_SUITES[@]}" sections_switch_test)
  [[ $kind == dynamic ]] && targets=("${DYNAMIC_TESTS[@]}" "${FOREIGN_TESTS[@]}")
  mkdir -p "$dir"
  cmake -S "$REPO" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DPERCPU_KEEP_ASSERTS=ON \
    -DPERCPU_BUILD_TOOLS=OFF -DPERCPU_BUILD_BENCHMARKS=OFF -DPERCPU_BUILD_EXAMPLES=OFF \
    -DPERCPU_STRESS_SCALE="$STRESS_SCALE" "${args[@]}" >"$dir/configure.log" 2>&1 ||
    { cat "$dir/configure.log" >&2; die "configure $arch-$kind failed"; }
  # The binaries' CMake targets are percpu_NAME, or NAME when it starts with
  # "percpu"; the files keep NAME (percpu_target() in cmake/percpu_helpers.cmake).
  local t cmake_targets=()
  for t in "${targets[@]}"; do
    case $t in percpu | percpu_* | percpu-*) cmake_targets+=("$t") ;; *) cmake_targets+=("percpu_$t") ;; esac
  done
  cmake --build "$dir" -j2 --target "${cmake_targets[@]}" >"$dir/build.log" 2>&1 ||
    { tail -40 "$dir/build.log" >&2; die "build $arch-$kind failed"; }
}
for arch in "${ARCHES[@]}"; do build "$arch" static; build "$arch" dynamic; done
say "builds ready ($(($(date +%s) - build_start))s)"

# --- Run lists (vm/init.sh's `run` lines) --------------------------------
# Runs are named GLIBC/MODE/TEST so the report can group them.
run() {  # name, then: NAME=VALUE..., rseq, --, argv...
  local name=$1 checks=(mode) settings=(PERCPU_STRESS_SCALE=$STRESS_SCALE)
  shift
  while [[ $1 != -- ]]; do
    if [[ $1 == rseq ]]; then checks+=(rseq); else settings+=("$1"); fi
    shift
  done
  shift
  echo "run $name timeout=600 ${checks[*]} -- $(printf '%q ' "${settings[@]}" "$@")"
}
glibc_version() { cat "${GLIBC[$1-$2]}/version" | sed 's/-.*//'; }
loader_name() { [[ $1 == x86_64 ]] && echo ld-linux-x86-64.so.2 || echo ld-linux-aarch64.so.1; }

static_runs() {  # prefix
  local p=$1 t
  # The free list's affinity-flipping stress case asserts that its flipper
  # thread moved a worker at least once; under TCG, with twelve busy workers
  # on two emulated CPUs, the flipper can go its whole (scaled) run without
  # being scheduled. It runs in every native lane; here it is left out.
  local filter
  for t in "${STATIC_SUITES[@]}"; do
    filter=GTEST_FILTER=-FreeListStressTest.AffinityFlipping
    [[ $t == per_cpu_test ]] && filter=GTEST_FILTER=$PER_CPU_FILTER
    local r
    for ((r = 0; r < REPEAT; r++)); do
      run "static/glibc/$t" PERCPU_EXPECT_OWNER=glibc PERCPU_EXPECT_BACKEND=rseq $filter rseq -- "$p/s/$t"
      run "static/own/$t" GLIBC_TUNABLES=glibc.pthread.rseq=0 PERCPU_EXPECT_OWNER=percpu \
        PERCPU_EXPECT_BACKEND=rseq $filter rseq -- "$p/s/$t"
      run "static/fallback/$t" PERCPU_EXPECT_OWNER=none $filter -- "$p/s/seccomp_exec" ENOSYS "$p/s/$t"
    done
  done
  run "static/sections-off/sections_switch_test" PERCPU_RSEQ_SECTIONS=off rseq -- "$p/s/sections_switch_test"
}
dynamic_runs() {  # arch prefix
  local arch=$1 p=$2 g t v owner
  for g in "${GLIBC_SUITES[@]}"; do
    v=$(glibc_version "$arch" "$g")
    owner=glibc
    local ld=("$p/g/$g/$(loader_name "$arch")" --library-path "$p/g/$g:$p/d/lib")
    for t in "${DYNAMIC_TESTS[@]}"; do
      # CpuExec and ForcedBackend re-execute the test binary itself, which
      # then needs the system's loader: the initramfs has none (the static
      # runs cover them).
      run "glibc-$v/glibc/$t" PERCPU_EXPECT_OWNER=$owner PERCPU_EXPECT_BACKEND=rseq \
        GTEST_FILTER=-CpuExec.*:ForcedBackend.* rseq -- "${ld[@]}" "$p/d/$t"
      run "glibc-$v/own/$t" GLIBC_TUNABLES=glibc.pthread.rseq=0 PERCPU_EXPECT_OWNER=percpu \
        PERCPU_EXPECT_BACKEND=rseq GTEST_FILTER=-CpuExec.*:ForcedBackend.* rseq -- "${ld[@]}" "$p/d/$t"
    done
  done
  # Another registrant first, under the newest glibc (whose own is off).
  g=${GLIBC_SUITES[-1]}
  v=$(glibc_version "$arch" "$g")
  local ld=("$p/g/$g/$(loader_name "$arch")" --library-path "$p/g/$g:$p/d/lib")
  for t in "${FOREIGN_TESTS[@]}"; do
    run "glibc-$v/other/$t" GLIBC_TUNABLES=glibc.pthread.rseq=0 PERCPU_EXPECT_OWNER=other \
      PERCPU_EXPECT_BACKEND=rseq rseq -- "${ld[@]}" "$p/d/$t"
  done
}

# --- Initramfs per arch --------------------------------------------------
pack() {  # arch
  local arch=$1 root=$BUILD/$1-root lib=/usr/lib/x86_64-linux-gnu t g
  [[ $arch == aarch64 ]] && lib=/usr/aarch64-linux-gnu/lib
  vm_root "$root" "$arch"
  mkdir -p "$root"/{s,d/lib,g}
  for t in seccomp_exec "${STATIC_SUITES[@]}" sections_switch_test; do
    cp "$(find "$BUILD/$arch-static" -name "$t" -type f -perm -u+x | head -n1)" "$root/s/"
  done
  for t in "${DYNAMIC_TESTS[@]}" "${FOREIGN_TESTS[@]}"; do
    cp "$(find "$BUILD/$arch-dynamic" -name "$t" -type f -perm -u+x | head -n1)" "$root/d/"
  done
  find "$BUILD/$arch-dynamic" -name 'librseq_registrant_*.so' -exec cp {} "$root/d/lib/" \;
  cp -L "$lib/libstdc++.so.6" "$lib/libgcc_s.so.1" "$root/d/lib/"
  for g in "${GLIBC_SUITES[@]}"; do
    mkdir -p "$root/g/$g" && cp "${GLIBC[$arch-$g]}"/lib/* "$root/g/$g/"
  done
  { static_runs ""; } >"$root/lane/runs-static"
  { static_runs ""; dynamic_runs "$arch" ""; } >"$root/lane/runs-full"
  vm_pack "$root" "$BUILD/$arch.cpio.gz"
}
for arch in "${ARCHES[@]}"; do pack "$arch"; done

# --- Runs ----------------------------------------------------------------
LOGS=$BUILD/logs
rm -rf "$LOGS" && mkdir -p "$LOGS"
contains() { local x=$1; shift; for y in "$@"; do [[ $x == "$y" ]] && return 0; done; return 1; }
boot() {  # arch suite
  local arch=$1 suite=$2 runs=runs-static extra="" log=$LOGS/$1-$2.log
  contains "$suite" "${DYNAMIC_SUITES[@]}" && runs=runs-full
  [[ $suite == "$DEBUG_SUITE" ]] && extra="rseq_debug=1"
  local start=$(date +%s) rc=0 attempt
  for attempt in 1 2; do
    rc=0
    vm_boot "$arch" "${KERNEL[$arch-$suite]}" "$BUILD/$arch.cpio.gz" 1200 $extra -- "/lane/$runs" >"$log" || rc=$?
    echo "qemu_exit $rc" >>"$log"
    # A VM that never reached init ran none of the tests (CI once saw one
    # end after 4 s, and could not say why). Boot it once more, and print
    # the first boot's last lines at the end of the lane; a second boot that
    # fails the same way fails the lane.
    grep -q "^$LANE: kernel " "$log" && break
    say "$arch $suite: the VM did not reach init (boot $attempt, qemu exit $rc after $(($(date +%s) - start))s)"
    if ((attempt == 1)); then cp "$log" "$LOGS/$arch-$suite.boot1.txt"; fi
  done
  say "$arch $suite ($(cat "$(dirname "${KERNEL[$arch-$suite]}")/package")): $(grep -m1 -E "^$LANE: [0-9]+ passed" "$log" | sed "s/^$LANE: //" || echo 'no summary') in $(($(date +%s) - start))s${extra:+ ($extra)}"
}
vm_start=$(date +%s)
for arch in "${ARCHES[@]}"; do
  for suite in $(suites_for "$arch"); do boot "$arch" "$suite"; done
done
vm_secs=$(($(date +%s) - vm_start))
# This machine's kernel: the dynamic matrix and the static suites, x86-64 only.
if contains x86_64 "${ARCHES[@]}"; then
  root=$BUILD/x86_64-root
  { static_runs "$root"; dynamic_runs x86_64 "$root"; } >"$BUILD/host-runs"
  TAG=$LANE "$root/bin/busybox" sh "$root/init" "$BUILD/host-runs" >"$LOGS/x86_64-host.log" 2>&1 || true
  say "x86_64 host $(uname -r): $(grep -m1 -E "^$LANE: [0-9]+ passed" "$LOGS/x86_64-host.log" | sed "s/^$LANE: //" || echo 'no summary')"
fi

# --- Report and verdict --------------------------------------------------
commit=$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo unknown)
dirty=$(git -C "$REPO" status --porcelain --untracked-files=no 2>/dev/null | head -c1)
doc=$REPO/docs/compatibility.md
# Only the whole matrix replaces the published table.
[[ -n ${KERNELS_NO_DOC:-} || "${AARCH64_SUITES[*]}" != "${SUITES[*]}" ]] && doc=$BUILD/compatibility.md
# (`|| status=$?`: under set -e a bare failing call would end the lane
# before the lines below say why.)
status=0
python3 "$REPO/scripts/lanes/vm/report.py" --tag "$LANE" --commit "$commit${dirty:+ (with local changes)}" \
  --out "$doc" "$LOGS"/*.log || status=$?
# CI keeps only the end of the lane's output: say why each failed run
# failed, from its own lines (gtest's failures and the run's verdict), so a
# failure seen once can be read without the VM logs.
if ((status != 0)); then
  for log in "$LOGS"/*.log; do
    # A log without its summary line: the VM's last words.
    if ! grep -qE "^$LANE: [0-9]+ passed" "$log"; then
      tail -n 15 "$log" | sed "s/^/[$LANE] FAILED detail $(basename "$log" .log) (no summary): /" >&2
    fi
    awk -v tag="$LANE" -v vm="$(basename "$log" .log)" '
      { sub(/\r$/, "") }
      $0 ~ "^" tag ": RUN "  { name = $3; n = 0; lines = 0; grab = 0; delete keep; next }
      $0 ~ "^" tag ": FAIL " {
        # Without gtest failure lines, the last lines of the run.
        if (n == 0) for (i = lines > 15 ? lines - 14 : 1; i <= lines; i++) keep[++n] = last[i % 15]
        for (i = 1; i <= n && i <= 20; i++) print "[" tag "] FAILED detail " vm " " name ": " keep[i]
        next
      }
      { last[++lines % 15] = $0 }
      /^\[/                  { grab = 0 }
      /: Failure$/           { grab = 1 }
      grab || /^\[  FAILED  \]|terminate|Assertion|Aborted|Segmentation/ { keep[++n] = $0 }
    ' "$log" >&2
  done
fi
for first in "$LOGS"/*.boot*.txt; do
  [[ -e $first ]] || continue
  say "warning: $(basename "$first" .txt) did not reach init; its last lines:"
  tail -n 20 "$first" | sed "s/^/[$LANE]   | /"
done
say "wall time: lane $(($(date +%s) - lane_start))s (VMs ${vm_secs}s); table in ${doc#$REPO/}"
exit $status
