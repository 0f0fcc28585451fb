#!/usr/bin/env bash
# The aarch64-system lane, aarch64 with real rseq: the test suite cross-built static for
# aarch64, packed into an initramfs and booted with Debian's arm64 kernel in
# qemu-system-aarch64 -smp 2, where the kernel really preempts and migrates
# the tests' threads and aborts their critical sections.
#
#   scripts/lanes/aarch64-system.sh            (from the repository root)
#
# As root on a fresh Debian 12 machine it installs what it needs with apt-get;
# the kernel and busybox come through scripts/lanes/vm/fetch.sh's private apt
# configuration. It fails, never skips, when it cannot run, and it fails
# unless the VM printed its kernel version, cpu_test.glibc showed glibc's rseq
# area following the thread from CPU to CPU, and every run passed with the
# rseq mode it was meant to have.
#
# The VM runs every test of the build that ctest lists (mode variants and
# forced backends included): the static glibc registers rseq itself
# (owner=glibc), GLIBC_TUNABLES=glibc.pthread.rseq=0 variants make percpu
# register its own, and seccomp_exec variants check the fallbacks on a real
# kernel. New test targets join automatically. scripts/lanes/vm/init.sh, run
# by busybox as /init, runs them and says how each went.
#
# Settings (environment):
#   AARCH64_SYSTEM_BUILD_DIR  build directory (default: build-aarch64-system)
#   AARCH64_SYSTEM_INCLUDE    regex of ctest names to run (default: all)
#   AARCH64_SYSTEM_EXCLUDE    regex of ctest names not to run (default: none)
#   AARCH64_STRESS_SCALE      PERCPU_STRESS_SCALE for the build and the runs (default: 0.5)
#   AARCH64_SYSTEM_TIMEOUT    seconds the whole VM may take (default: 900)
#   AARCH64_TIMEOUT_FACTOR    multiplies each test's ctest TIMEOUT in the VM (default: 1)
#   AARCH64_KERNEL_SUITE      the Debian suite whose arm64 cloud kernel boots (default: bookworm)
#   AARCH64_QEMU_CPU          qemu -cpu model (default: cortex-a57)
#   VM_CACHE                  where downloaded packages are kept (default: build/kernels-cache)
set -euo pipefail

# Tests that must be in the VM's run list; every other test target the build
# registers with ctest (counter, rseq_cs, free list, pool...) runs too.
REQUIRED_TESTS=(cpu_test percpu_c_test)

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUILD=${AARCH64_SYSTEM_BUILD_DIR:-$REPO/build-aarch64-system}
case $BUILD in /*) ;; *) BUILD=$REPO/$BUILD ;; esac
STRESS_SCALE=${AARCH64_STRESS_SCALE:-0.5}
VM_TIMEOUT=${AARCH64_SYSTEM_TIMEOUT:-900}
TIMEOUT_FACTOR=${AARCH64_TIMEOUT_FACTOR:-1}
VM_AARCH64_CPU=${AARCH64_QEMU_CPU:-cortex-a57}
LANE=aarch64-system
source "$REPO/scripts/lanes/lib.sh"
lane_start=$(date +%s)

need_packages qemu-system-arm g++-aarch64-linux-gnu cpio cmake ninja-build googletest gzip python3
KERNEL=$(fetch kernel arm64 "${AARCH64_KERNEL_SUITE:-bookworm}")
say "kernel: $(cat "$(dirname "$KERNEL")/package")"

# --- Static aarch64 test binaries ----------------------------------------
build_start=$(date +%s)
mkdir -p "$BUILD"
cmake -S "$REPO" -B "$BUILD" -G Ninja \
  -DCMAKE_TOOLCHAIN_FILE="$REPO/cmake/toolchains/aarch64-linux-gnu.cmake" \
  -DCMAKE_BUILD_TYPE=Release -DPERCPU_KEEP_ASSERTS=ON \
  -DCMAKE_EXE_LINKER_FLAGS=-static \
  -DCMAKE_CROSSCOMPILING_EMULATOR= \
  -DPERCPU_BUILD_TOOLS=OFF -DPERCPU_BUILD_BENCHMARKS=OFF -DPERCPU_BUILD_EXAMPLES=OFF \
  -DPERCPU_STRESS_SCALE="$STRESS_SCALE" >"$BUILD/configure.log" 2>&1 ||
  { cat "$BUILD/configure.log"; die "configure failed"; }
cmake --build "$BUILD" -j2 || die "build failed"

ROOT=$BUILD/initramfs-root
vm_root "$ROOT" aarch64
ctest --test-dir "$BUILD" --show-only=json-v1 >"$BUILD/tests.json" || die "ctest cannot list the tests"
python3 "$REPO/scripts/lanes/vm/ctest_runs.py" --json "$BUILD/tests.json" --root "$ROOT" \
  --include "${AARCH64_SYSTEM_INCLUDE:-}" --exclude "${AARCH64_SYSTEM_EXCLUDE:-}" \
  --require "${REQUIRED_TESTS[@]}" --env "PERCPU_STRESS_SCALE=$STRESS_SCALE" \
  --timeout-factor "$TIMEOUT_FACTOR" || die "cannot make the VM's run list"
runs=$(grep -c '^run ' "$ROOT/lane/runs")
vm_pack "$ROOT" "$BUILD/initramfs.cpio.gz"
build_secs=$(($(date +%s) - build_start))
say "initramfs: $runs runs, $(du -h "$BUILD/initramfs.cpio.gz" | cut -f1) (build and pack: ${build_secs}s)"

# --- Boot ------------------------------------------------------------------
LOG=$BUILD/serial.log
say "booting qemu-system-aarch64 -M virt -cpu $VM_AARCH64_CPU -smp 2 (limit ${VM_TIMEOUT}s)"
vm_start=$(date +%s)
set +e
vm_boot aarch64 "$KERNEL" "$BUILD/initramfs.cpio.gz" "$VM_TIMEOUT" | tee "$LOG" |
  grep --line-buffered -E '^aarch64-system: |percpu test mode:|^\[  FAILED  \]|Kernel panic'
qemu_rc=${PIPESTATUS[0]}
set -e
vm_secs=$(($(date +%s) - vm_start))

# --- Verdict -------------------------------------------------------------
problems=()
((qemu_rc == 0)) || problems+=("qemu exited with status $qemu_rc$( ((qemu_rc == 124)) && echo " (timed out after ${VM_TIMEOUT}s)")")
kernel_line=$(grep -m1 '^aarch64-system: kernel Linux ' "$LOG" || true)
[[ -n $kernel_line ]] || problems+=("no kernel version line")
grep -q '^aarch64-system: cpus online: \([2-9]\|[1-9][0-9]\)' "$LOG" || problems+=("fewer than 2 CPUs online in the VM")
# cpu_test pins itself to every CPU in turn and checks cpu_id() there, each
# backend in turn: under glibc's registration, that is rseq following migration.
rseq_line=$(awk '$0=="aarch64-system: RUN cpu_test.glibc"{p=1} p&&/^aarch64-system: (PASS|FAIL) /{exit}
                 p&&/^checked backend rseq on ([2-9]|[1-9][0-9]) CPUs/{print; exit}' "$LOG")
if [[ -z ${AARCH64_SYSTEM_INCLUDE:-}${AARCH64_SYSTEM_EXCLUDE:-} ]]; then
  [[ -n $rseq_line ]] || problems+=("cpu_test.glibc did not show rseq following migration")
  grep -q '^aarch64-system: PASS cpu_test.glibc (.*owner=glibc, backend=rseq)' "$LOG" ||
    problems+=("cpu_test.glibc did not pass on glibc's rseq registration")
fi
summary=$(grep -m1 -E '^aarch64-system: [0-9]+ passed, [0-9]+ failed$' "$LOG" || true)
if [[ -z $summary ]]; then
  problems+=("no summary line (the VM crashed, hung or was cut off)")
else
  read -r passed failed < <(sed -E 's/^aarch64-system: ([0-9]+) passed, ([0-9]+) failed$/\1 \2/' <<<"$summary")
  ((failed == 0)) || problems+=("$failed failed")
  ((passed == runs)) || problems+=("$passed of $runs runs passed")
fi
pass_lines=$(grep -c '^aarch64-system: PASS ' "$LOG" || true)
((pass_lines == runs)) || problems+=("$pass_lines PASS lines for $runs runs")
# Every variant that names an owner must have run with it; a silent fallback fails here.
for owner in glibc percpu; do
  want=$(awk -v o="$owner" '/^run / && / PERCPU_EXPECT_OWNER=/{for(i=3;i<=NF;i++) if($i=="PERCPU_EXPECT_OWNER="o) print $2}' "$ROOT/lane/runs")
  for name in $want; do
    grep -q "^aarch64-system: PASS $name (.*owner=$owner," "$LOG" ||
      problems+=("$name did not pass with rseq owner=$owner")
  done
done

echo
say "---- summary ----"
say "${kernel_line#aarch64-system: }"
say "rseq follows migration: cpu_test.glibc ${rseq_line:-did not say}"
grep -E '^aarch64-system: (PASS|FAIL) ' "$LOG" | sed "s/^aarch64-system: /[$LANE]   /" || true
say "${summary#aarch64-system: }"
say "wall time: build+pack ${build_secs}s, VM ${vm_secs}s, lane $(($(date +%s) - lane_start))s"
if ((${#problems[@]})); then
  # The whole output of every failed run, then the reasons.
  for name in $(sed -n 's/^aarch64-system: FAIL \([^ ]*\) .*/\1/p' "$LOG"); do
    echo "[$LANE] ---- output of $name ----" >&2
    awk -v n="$name" '$0=="aarch64-system: RUN "n{p=1} p{print} p&&index($0,"aarch64-system: FAIL "n" ")==1{exit}' "$LOG" |
      tail -n 150 >&2
  done
  for p in "${problems[@]}"; do echo "[$LANE] FAILED: $p" >&2; done
  echo "[$LANE] serial log: $LOG" >&2
  exit 1
fi
say "OK: $runs runs passed under real rseq on $(sed 's/^aarch64-system: kernel //' <<<"$kernel_line" | cut -d' ' -f2)"
