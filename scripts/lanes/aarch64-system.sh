#!/usr/bin/env bash
# The aarch64-system lane, aarch64 with real rseq: the test suite cross-built static for
# aarch64, packed into an initramfs and booted with Debian's arm64 kernel in
# qemu-system-aarch64 -smp 2, where the kernel really preempts and migrates
# the tests' threads and aborts their critical sections.
#
#   scripts/lanes/aarch64-system.sh            (from the repository root)
#
# As root on a fresh Debian 12 machine it installs what it needs with apt-get
# (adding the arm64 architecture to apt to fetch the kernel package). It
# fails, never skips, when it cannot run, and it fails unless the VM printed
# its kernel version, proved rseq registered and follows migration, and every
# run passed with the rseq mode it was meant to have.
#
# The VM runs every test of the build that ctest lists (mode variants and
# forced backends included): the static glibc registers rseq itself
# (owner=glibc), GLIBC_TUNABLES=glibc.pthread.rseq=0 variants make percpu
# register its own, and seccomp_exec variants check the fallbacks on a real
# kernel. New test targets join automatically.
#
# Settings (environment):
#   AARCH64_SYSTEM_BUILD_DIR  build directory (default: build-aarch64-system)
#   AARCH64_SYSTEM_INCLUDE    regex of ctest names to run (default: all)
#   AARCH64_SYSTEM_EXCLUDE    regex of ctest names not to run (default: none)
#   AARCH64_STRESS_SCALE      PERCPU_STRESS_SCALE for the build and the runs (default: 0.5)
#   AARCH64_SYSTEM_TIMEOUT    seconds the whole VM may take (default: 900)
#   AARCH64_TIMEOUT_FACTOR    multiplies each test's ctest TIMEOUT in the VM (default: 1)
#   AARCH64_KERNEL_PACKAGE    the kernel .deb to boot (default: what
#                             linux-image-cloud-arm64 depends on, -unsigned)
#   AARCH64_QEMU_CPU          qemu -cpu model (default: cortex-a57)
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
QEMU_CPU=${AARCH64_QEMU_CPU:-cortex-a57}
LANE=aarch64-system
lane_start=$(date +%s)

say() { echo "[$LANE] $*"; }
die() { echo "[$LANE] FAILED: $*" >&2; exit 1; }

# --- Debian packages -------------------------------------------------------
packages=(qemu-system-arm qemu-user g++-aarch64-linux-gnu cpio cmake ninja-build googletest gzip)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  if [[ $(id -u) -ne 0 ]]; then
    die "missing packages; run: apt-get install -y ${missing[*]}"
  fi
  say "installing ${missing[*]}"
  apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
fi

# --- Debian's arm64 kernel -------------------------------------------------
KCACHE=$BUILD/kernel-cache
mkdir -p "$KCACHE"
if ! dpkg --print-foreign-architectures | grep -qx arm64; then
  [[ $(id -u) -eq 0 ]] || die "apt does not know arm64; run as root: dpkg --add-architecture arm64 && apt-get update"
  say "adding arm64 to apt's architectures to fetch the arm64 kernel package"
  dpkg --add-architecture arm64
  apt-get update -q >/dev/null
fi
kpkg=${AARCH64_KERNEL_PACKAGE:-}
if [[ -z $kpkg ]]; then
  image=$(apt-cache depends linux-image-cloud-arm64:arm64 2>/dev/null |
          sed -n 's/^ *Depends: \(linux-image-[0-9][^:]*-cloud-arm64\)\(:arm64\)\?$/\1/p' | head -n1)
  if [[ -z $image ]] && [[ $(id -u) -eq 0 ]]; then
    apt-get update -q >/dev/null
    image=$(apt-cache depends linux-image-cloud-arm64:arm64 2>/dev/null |
            sed -n 's/^ *Depends: \(linux-image-[0-9][^:]*-cloud-arm64\)\(:arm64\)\?$/\1/p' | head -n1)
  fi
  [[ -n $image ]] || die "cannot resolve linux-image-cloud-arm64:arm64 in apt (apt-get update?)"
  kpkg=$image-unsigned
fi
deb=$(ls "$KCACHE"/"${kpkg}"_*_arm64.deb 2>/dev/null | head -n1 || true)
if [[ -z $deb ]]; then
  say "fetching $kpkg:arm64 with apt-get download"
  (cd "$KCACHE" && apt-get download -q -o APT::Sandbox::User=root "$kpkg:arm64" >/dev/null) ||
    die "apt-get download $kpkg:arm64 failed"
  deb=$(ls "$KCACHE"/"${kpkg}"_*_arm64.deb | head -n1)
fi
KERNEL=$KCACHE/Image
if [[ ! -s $KERNEL || $deb -nt $KERNEL ]]; then
  rm -rf "$KCACHE/x" && mkdir -p "$KCACHE/x"
  dpkg-deb --fsys-tarfile "$deb" | tar -x -C "$KCACHE/x" --wildcards './boot/vmlinuz-*'
  vmlinuz=$(ls "$KCACHE"/x/boot/vmlinuz-* | head -n1)
  [[ -s $vmlinuz ]] || die "no /boot/vmlinuz-* in $deb"
  if gzip -t "$vmlinuz" 2>/dev/null; then gunzip -c "$vmlinuz" >"$KERNEL"; else cp "$vmlinuz" "$KERNEL"; fi
  rm -rf "$KCACHE/x"
fi
say "kernel: $(basename "$deb")"

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
rm -rf "$ROOT"
mkdir -p "$ROOT/lane" "$ROOT/proc" "$ROOT/sys" "$ROOT/dev" "$ROOT/tmp" "$ROOT/bin"
aarch64-linux-gnu-gcc -std=gnu11 -O2 -Wall -Wextra -Werror -static \
  -o "$ROOT/init" "$REPO/scripts/lanes/aarch64/init.c" || die "building /init failed"

ctest --test-dir "$BUILD" --show-only=json-v1 >"$BUILD/tests.json" || die "ctest cannot list the tests"
cmake -DJSON="$BUILD/tests.json" -DMANIFEST="$ROOT/lane/runs" -DFILES="$BUILD/initramfs.files" \
  -DBUILD_DIR="$BUILD" -DINCLUDE="${AARCH64_SYSTEM_INCLUDE:-}" -DEXCLUDE="${AARCH64_SYSTEM_EXCLUDE:-}" \
  -DREQUIRED="$(IFS=';'; echo "${REQUIRED_TESTS[*]}")" \
  -DEXTRA_ENV="PERCPU_STRESS_SCALE=$STRESS_SCALE" -DTIMEOUT_FACTOR="$TIMEOUT_FACTOR" \
  -P "$REPO/scripts/lanes/aarch64/make_manifest.cmake" || die "cannot make the VM's run list"

while IFS= read -r f; do
  [[ -n $f ]] || continue
  if head -c4 "$f" | grep -q $'\x7fELF' && aarch64-linux-gnu-readelf -l "$f" | grep -q INTERP; then
    die "$f is dynamically linked; the initramfs has no libraries"
  fi
  mkdir -p "$ROOT$(dirname "$f")"
  cp "$f" "$ROOT$f"
done <"$BUILD/initramfs.files"
sed -n 's/^cwd //p' "$ROOT/lane/runs" | sort -u | while IFS= read -r d; do mkdir -p "$ROOT$d"; done
runs=$(grep -c '^run ' "$ROOT/lane/runs")
(cd "$ROOT" && find . | LC_ALL=C sort | cpio -o -H newc --quiet -R 0:0 | gzip -1) >"$BUILD/initramfs.cpio.gz"
build_secs=$(($(date +%s) - build_start))
say "initramfs: $runs runs, $(du -h "$BUILD/initramfs.cpio.gz" | cut -f1) (build and pack: ${build_secs}s)"

# --- Boot ------------------------------------------------------------------
LOG=$BUILD/serial.log
say "booting qemu-system-aarch64 -M virt -cpu $QEMU_CPU -smp 2 (limit ${VM_TIMEOUT}s)"
vm_start=$(date +%s)
set +e
timeout --kill-after=10 "$VM_TIMEOUT" qemu-system-aarch64 -M virt -cpu "$QEMU_CPU" -smp 2 -m 1024 \
  -display none -no-reboot -monitor none -serial stdio \
  -kernel "$KERNEL" -initrd "$BUILD/initramfs.cpio.gz" \
  -append "console=ttyAMA0 panic=-1 loglevel=4 rdinit=/init" </dev/null 2>&1 |
  tr -d '\r' | tee "$LOG" |
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
rseq_line=$(grep -m1 '^aarch64-system: rseq registered by glibc' "$LOG" || true)
[[ -n $rseq_line ]] || problems+=("no line proving rseq registered and follows migration")
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
  want=$(awk -v o="$owner" '/^run /{n=$2} $0=="env PERCPU_EXPECT_OWNER="o{print n}' "$ROOT/lane/runs")
  for name in $want; do
    grep -q "^aarch64-system: PASS $name (.*owner=$owner," "$LOG" ||
      problems+=("$name did not pass with rseq owner=$owner")
  done
done

echo
say "---- summary ----"
say "${kernel_line#aarch64-system: }"
say "${rseq_line#aarch64-system: }"
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
