#!/usr/bin/env bash
# The aarch64-user lane, aarch64 fallback paths: the suite cross-built with
# g++-aarch64-linux-gnu and run by ctest under qemu-aarch64 (qemu-user).
#
#   scripts/lanes/aarch64-user.sh            (from the repository root)
#
# qemu-user answers rseq with ENOSYS, so glibc's registration and percpu's own
# both fail and every test runs on the fallback: owner none, backend syscall
# (arm64's vDSO has no getcpu). The lane asserts exactly that in every test
# (PERCPU_EXPECT_OWNER=none, PERCPU_EXPECT_BACKEND=syscall, which the
# forced-backend variants override with their own), so a run on another path
# fails.
#
# Not run here, by design (each is covered by the aarch64-system lane, which
# runs them on a real arm64 kernel):
#   *.glibc, *.own   they assert rseq is registered; under qemu-user it cannot be.
#   *.fallback, *.seccomp_eperm
#                    seccomp_exec cannot install its filter under qemu-user
#                    (qemu refuses PR_SET_SECCOMP with EINVAL). The lane checks
#                    that this is still so and runs them if it changes.
#   gtest cases in EXEC_GTEST_EXCLUDE, only when the kernel has no binfmt_misc
#                    entry for aarch64 (containers): they exec an aarch64
#                    binary (CpuExec, ForcedBackend, and gtest's "threadsafe" death tests,
#                    which re-exec the test), which the host kernel cannot
#                    start without one.
#   gtest cases in QEMU_GTEST_EXCLUDE: a forked child of a multithreaded
#                    program that starts threads makes Debian 12's qemu-user
#                    (7.2) abort with "qemu_plugin_vcpu_init_hook: assertion
#                    failed" before the test's code can fail or pass.
#
# As root on a fresh Debian 12 machine it installs what it needs with apt-get.
#
# Settings (environment):
#   AARCH64_USER_BUILD_DIR   build directory (default: build-aarch64-user)
#   AARCH64_STRESS_SCALE     PERCPU_STRESS_SCALE for the build and the runs (default: 0.25)
#   AARCH64_USER_EXCLUDE     a ctest -E regex of test names to leave out as well
set -euo pipefail

# gtest cases that exec an aarch64 program: they need binfmt_misc for qemu-aarch64.
EXEC_GTEST_EXCLUDE=(CpuExec.WorksAfterExec 'ForcedBackend.*' '*DeathTest.*' 'HiddenSys.MaxCpusBoundsEveryIdWithoutSys'
                    'HiddenSys.MaxCpusFollowsASparsePossibleList'
                    'HiddenSys.AListThatMissesCpusLeavesIdsInRangeWhenTheMaskWidens'
                    'HiddenSys.ListsPoolsAndCountersCostAsMuchWithFourThousandPossibleCpusAsWithTwo'
                    'CpuListsTest.SectionUsersAreCountedBeforeAStartedSectionCommits'
                    'CidCounterTest.WithFourThousandPossibleCpus' 'CidPerCpuTest.WithFourThousandPossibleCpus')
# gtest cases that qemu-user 7.2 itself cannot run (fork, then threads in the child).
QEMU_GTEST_EXCLUDE=('*.ForkDuringHeavyUse' 'SharedMutexStressTest.ForkWhile*')
# gtest cases that install a seccomp filter themselves (left out when qemu-user
# refuses filters, as it does for seccomp_exec).
SECCOMP_GTEST_EXCLUDE=()

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUILD=${AARCH64_USER_BUILD_DIR:-$REPO/build-aarch64-user}
case $BUILD in /*) ;; *) BUILD=$REPO/$BUILD ;; esac
STRESS_SCALE=${AARCH64_STRESS_SCALE:-0.25}
SYSROOT=/usr/aarch64-linux-gnu
LANE=aarch64-user
source "$REPO/scripts/lanes/lib.sh"
lane_start=$(date +%s)

need_packages qemu-user g++-aarch64-linux-gnu cmake ninja-build googletest binutils-aarch64-linux-gnu
QEMU=$(command -v qemu-aarch64) || die "qemu-aarch64 not found"

mkdir -p "$BUILD"
cmake -S "$REPO" -B "$BUILD" -G Ninja \
  -DCMAKE_TOOLCHAIN_FILE="$REPO/cmake/toolchains/aarch64-linux-gnu.cmake" \
  -DCMAKE_BUILD_TYPE=Release -DPERCPU_KEEP_ASSERTS=ON \
  -DCMAKE_CROSSCOMPILING_EMULATOR="$QEMU;-L;$SYSROOT" \
  -DPERCPU_BUILD_TOOLS=OFF -DPERCPU_BUILD_BENCHMARKS=OFF -DPERCPU_BUILD_EXAMPLES=OFF \
  -DPERCPU_STRESS_SCALE="$STRESS_SCALE" >"$BUILD/configure.log" 2>&1 ||
  { cat "$BUILD/configure.log"; die "configure failed"; }
cmake --build "$BUILD" -j2 || die "build failed"

# What qemu-user does with rseq and seccomp, shown rather than assumed.
seccomp_exec=$(find "$BUILD" -name seccomp_exec -type f -perm -u+x | head -n1)
[[ -n $seccomp_exec ]] || die "seccomp_exec was not built"
# Tests are left out by ctest label (cmake/percpu_helpers.cmake): the mode
# variants that assert registered rseq, and another registrant's tests, which
# need rseq; qemu-user has none.
exclude_labels='mode-glibc|mode-own|foreign-rseq'
if probe=$("$QEMU" -L "$SYSROOT" "$seccomp_exec" ENOSYS /bin/true 2>&1); then
  say "qemu-user installed a seccomp filter: running the seccomp variants too"
else
  say "qemu-user cannot install seccomp filters (${probe##*: }): the .fallback and .seccomp_eperm variants run in the aarch64-system lane"
  exclude_labels='mode-glibc|mode-own|mode-fallback|mode-eperm|foreign-rseq'
  SECCOMP_GTEST_EXCLUDE=('*.RseqAndFallbackThreadsOnTheSameSlots')
  say "so also leaving out ${SECCOMP_GTEST_EXCLUDE[*]} (it installs a per-thread filter; it runs in the aarch64-system lane)"
fi
gtest_exclude=("${QEMU_GTEST_EXCLUDE[@]}" "${SECCOMP_GTEST_EXCLUDE[@]}")
say "qemu-user cannot run a forked child that starts threads: leaving out ${QEMU_GTEST_EXCLUDE[*]} (they run in the aarch64-system lane)"
if [[ -r /proc/sys/fs/binfmt_misc/qemu-aarch64 ]] && grep -qx enabled /proc/sys/fs/binfmt_misc/qemu-aarch64; then
  say "binfmt_misc runs aarch64 programs: exec and death tests included"
else
  gtest_exclude+=("${EXEC_GTEST_EXCLUDE[@]}")
  say "no binfmt_misc entry for aarch64 here: leaving out ${EXEC_GTEST_EXCLUDE[*]} (they exec an aarch64 program; they run in the aarch64-system lane)"
fi
gtest_filter="-$(IFS=:; echo "${gtest_exclude[*]}")"
say "GTEST_FILTER=$gtest_filter"
exclude_names=(-E "${AARCH64_USER_EXCLUDE:-^$}")
say "ctest -LE '$exclude_labels' ${AARCH64_USER_EXCLUDE:+-E '$AARCH64_USER_EXCLUDE' }(variants that assert registered rseq, and other registrants' tests: qemu-user has no rseq)"

LOG=$BUILD/ctest.log
set +e
(cd "$BUILD" && env PERCPU_EXPECT_OWNER=none PERCPU_EXPECT_BACKEND=syscall \
   PERCPU_STRESS_SCALE="$STRESS_SCALE" GTEST_FILTER="$gtest_filter" \
   ctest -LE "$exclude_labels" "${exclude_names[@]}" -j2 --output-on-failure --timeout 600 -V) >"$LOG" 2>&1
rc=$?
set -e

ran=$(grep -cE '^ *[0-9]+/[0-9]+ Test +#' "$LOG" || true)
echo
say "---- summary ----"
grep -E '^[0-9]+: percpu (test )?mode:|^[0-9]+: C API checked' "$LOG" | sort -u -t: -k1,1n | sed "s/^/[$LANE]   /" || true
grep -E '^ *[0-9]+/[0-9]+ Test +#' "$LOG" | sed "s/^ */[$LANE]   /"
grep -E '% tests passed' "$LOG" | sed "s/^/[$LANE] /"
say "wall time: $(($(date +%s) - lane_start))s"
if ((rc != 0)); then
  grep -B2 -A25 -E 'Failure$|FAILED|\*\*\*' "$LOG" | head -150 >&2 || true
  echo "[$LANE] FAILED: ctest exited $rc (full log: $LOG)" >&2
  exit 1
fi
((ran > 0)) || die "ctest ran no tests"
# Every gtest run must have printed its mode, and on the fallback.
# (Collected, then tested: a `| grep -q` at the end of a pipeline under
# pipefail turns a match into a failure whenever the writer is still writing.)
owners=$(grep -E '^[0-9]+: percpu test mode:' "$LOG" | grep -v 'rseq owner=none,' || true)
[[ -z $owners ]] || die "a run reported a rseq owner under qemu-user: ${owners%%$'\n'*}"
grep -q 'registration_error=38 ' "$LOG" || die "no run showed rseq failing with ENOSYS"
say "OK: $ran tests on the fallback paths under qemu-user"
