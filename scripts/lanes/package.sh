#!/usr/bin/env bash
# The package lane: percpu's Debian packages, built, installed, used and
# removed as a Debian user would, and libpercpu.so's ABI against the kept dump.
#
#   PACKAGE_BUILD_DIR=build/lanes/package scripts/lanes/package.sh   (as root)
#
#   1. a shared Release build (with -g for abidiff; cpack strips the packaged
#      files), tests off, and `cpack -G DEB`: libpercpu<SOVERSION>,
#      libpercpu-dev, percpu-tools
#   2. scripts/abi.sh check on the built library: only percpu's symbols, of
#      percpu::internal only abi/internal-exports.txt, abidiff against
#      abi/libpercpu.abi
#   3. dpkg -i on this machine (refused if any percpu package is installed
#      already, so the lane never removes what it did not install); what
#      each package owns, from dpkg -L
#   4. tests/consumer built against the installed packages with
#      find_package (the shared library and percpu::percpu_static) and with
#      pkg-config, and run; percpu-bench --version, the man pages, the preload
#   5. dpkg --purge, then none of the files the packages owned may remain
# The packages are purged on every exit once installed, failure included.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
B=${PACKAGE_BUILD_DIR:-$root/build/lanes/package}
jobs=$(nproc 2>/dev/null || echo 2)
step() { echo "--- package: $*"; }

[[ $(id -u) -eq 0 ]] || { echo "package lane: dpkg -i needs root" >&2; exit 1; }
installed=$(dpkg-query -W -f='${Package} ${Status}\n' 'libpercpu*' 'percpu-*' 2>/dev/null |
            grep ' installed$' || true)
if [[ -n $installed ]]; then
  echo "package lane: a percpu package is installed already; remove it first:" >&2
  echo "$installed" >&2
  exit 1
fi

step "shared Release build and cpack -G DEB"
rm -rf "$B/packages"
mkdir -p "$B"
cmake -S "$root" -B "$B/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS=-g \
  -DCMAKE_INSTALL_PREFIX=/usr -DBUILD_SHARED_LIBS=ON -DBUILD_TESTING=OFF \
  -DPERCPU_BUILD_BENCHMARKS=OFF -DPERCPU_BUILD_EXAMPLES=OFF -DPERCPU_WERROR=ON \
  >"$B/configure.log" 2>&1 || { cat "$B/configure.log"; exit 1; }
cmake --build "$B/build" -j "$jobs" >"$B/build.log" 2>&1 || { tail -60 "$B/build.log"; exit 1; }
(cd "$B/build" && cpack -G DEB -B "$B/packages") >"$B/cpack.log" 2>&1 || { cat "$B/cpack.log"; exit 1; }
debs=("$B"/packages/*.deb)
[[ ${#debs[@]} -eq 3 ]] || { echo "package lane: want 3 packages, got: ${debs[*]}" >&2; exit 1; }
names=()
for deb in "${debs[@]}"; do
  names+=("$(dpkg-deb -f "$deb" Package)")
  echo "$(basename "$deb"): Depends: $(dpkg-deb -f "$deb" Depends)"
done
soversion=$(readlink "$B/build/percpu/libpercpu.so")  # libpercpu.so.MAJOR.MINOR
runtime=libpercpu${soversion#libpercpu.so.}
for want in "$runtime" libpercpu-dev percpu-tools; do
  [[ " ${names[*]} " == *" $want "* ]] || { echo "package lane: no package $want" >&2; exit 1; }
done
dpkg-deb -f "$B"/packages/libpercpu-dev_*.deb Depends | grep -q "^$runtime (= " ||
  { echo "package lane: libpercpu-dev does not depend on $runtime at its version" >&2; exit 1; }

step "ABI: scripts/abi.sh check"
"$root/scripts/abi.sh" check "$B/build/percpu/libpercpu.so"

# dpkg, waiting while another apt or dpkg on this machine holds its lock.
dpkg_waiting() {  # log, dpkg arguments...
  local log=$1 try; shift
  for try in $(seq 60); do
    dpkg "$@" >"$log" 2>&1 && return 0
    grep -q 'lock' "$log" || { cat "$log"; return 1; }
    sleep 5
  done
  cat "$log"; return 1
}

step "dpkg -i ${names[*]}"
purge() { dpkg_waiting "$B/purge.log" --purge "${names[@]}"; }
trap 'purge || true' EXIT
dpkg_waiting "$B/install.log" -i "${debs[@]}"
owned=$B/owned-files.txt
for n in "${names[@]}"; do dpkg -L "$n"; done | sort -u |
  while read -r path; do [[ -d $path ]] || echo "$path"; done >"$owned"
echo "the packages own $(wc -l <"$owned") files"

step "consumer with find_package(percpu) from /usr"
consumer=$root/tests/consumer
rm -rf "$B/consumer-cmake" "$B/consumer-pc"
cmake -S "$consumer" -B "$B/consumer-cmake" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  >"$B/consumer-configure.log" 2>&1 || { cat "$B/consumer-configure.log"; exit 1; }
cmake --build "$B/consumer-cmake" >"$B/consumer-build.log" 2>&1 || { cat "$B/consumer-build.log"; exit 1; }
"$B/consumer-cmake/percpu_consumer"
"$B/consumer-cmake/percpu_c_consumer"
# ldd's output is taken whole before it is searched: `ldd | grep -q` under
# pipefail fails whenever grep exits on its match before ldd has written its
# last line (SIGPIPE), which a loaded machine makes happen.
linked=$(ldd "$B/consumer-cmake/percpu_consumer")
loaded=$(awk -v so="$soversion" '$1 == so && $2 == "=>" { print $3 }' <<<"$linked")
packaged=$(grep "/$soversion\$" "$owned" || true)
if [[ -z $loaded || -z $packaged || $(realpath "$loaded") != "$(realpath "$packaged")" ]]; then
  echo "package lane: the consumer does not load the packaged $soversion (${packaged:-not in the packages})" >&2
  echo "$linked" >&2
  exit 1
fi
echo "consumer loads $loaded"
[[ -x $B/consumer-cmake/percpu_consumer_static ]] ||
  { echo "package lane: percpu::percpu_static was not found in the installed package" >&2; exit 1; }
"$B/consumer-cmake/percpu_consumer_static"
linked=$(ldd "$B/consumer-cmake/percpu_consumer_static")
if grep -q libpercpu <<<"$linked"; then
  echo "package lane: the static consumer loads libpercpu.so" >&2; echo "$linked" >&2; exit 1
fi

step "consumer with pkg-config --cflags --libs percpu"
make -s -C "$consumer" BUILD="$B/consumer-pc"
"$B/consumer-pc/percpu_consumer"
"$B/consumer-pc/percpu_c_consumer"
pkg-config --static --libs percpu | grep -q -- '-lstdc++' ||
  { echo "package lane: pkg-config --static misses the static library's dependencies" >&2; exit 1; }

step "percpu-bench, the man pages and the preload"
version=$(sed -n 's/^project(percpu VERSION \([0-9.]*\).*/\1/p' "$root/CMakeLists.txt")
[[ $(/usr/bin/percpu-bench --version) == "percpu-bench $version" ]] ||
  { echo "package lane: percpu-bench --version is not 'percpu-bench $version'" >&2; exit 1; }
grep -q '/usr/share/man/man1/percpu-bench.1' "$owned" && grep -q '/usr/share/man/man8/libpercpu_getcpu.8' "$owned" ||
  { echo "package lane: a man page is missing" >&2; exit 1; }
grep -q '/usr/share/doc/percpu/LICENSE' "$owned" || { echo "package lane: no LICENSE" >&2; exit 1; }
preload=$(grep '/libpercpu_getcpu.so$' "$owned")
trace=$B/preload-trace.txt
rm -f "$trace"
cat >"$B/getcpu.c" <<'EOF'
#define _GNU_SOURCE
#include <sched.h>
int main(void) { return sched_getcpu() < 0; }
EOF
cc -O2 "$B/getcpu.c" -o "$B/getcpu"
LD_PRELOAD=$preload PERCPU_PRELOAD_TRACE=$trace "$B/getcpu"
grep -q 'sched_getcpu=1' "$trace" || { echo "package lane: the packaged preload answered no call" >&2; exit 1; }
echo "preload: $(cat "$trace")"

step "dpkg --purge ${names[*]}"
purge
trap - EXIT
left=$(while read -r path; do [[ -e $path || -L $path ]] && echo "$path"; done <"$owned" || true)
if [[ -n $left ]]; then
  echo "package lane: left behind after dpkg --purge:" >&2
  echo "$left" >&2
  exit 1
fi
still=$(dpkg-query -W -f='${Package} ${Status}\n' "${names[@]}" 2>/dev/null | grep ' installed$' || true)
[[ -z $still ]] || { echo "package lane: still installed: $still" >&2; exit 1; }
echo "package lane: built, installed, used and removed ${names[*]}; nothing left"
