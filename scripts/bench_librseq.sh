#!/usr/bin/env bash
# scripts/bench_librseq.sh LIBRSEQ_CLONE [ROUNDS]
#
# percpu beside librseq in one process (benchmarks/librseq/side_by_side.cpp):
# cpu_id(), counter::add(), per_cpu<T>::add(), counter::load() and free_list
# pop+push against librseq's read, add and sum and a per-CPU list on its
# sections, 9 alternating rounds by default, in a default
# -O2 build and again with -falign-loops=64; each build twice, with glibc
# registering rseq and with librseq registering it first (glibc's off).
#
# LIBRSEQ_CLONE is a clone of https://github.com/compudj/librseq that you
# made; it is built here (autotools) into build/librseq/prefix. Debian does
# not package librseq, so nothing in percpu's build or CI needs it; this
# script installs autoconf, automake and libtool as root when they are
# missing, or says which to install.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
src=${1:?usage: scripts/bench_librseq.sh LIBRSEQ_CLONE [ROUNDS]}
rounds=${2:-9}
src=$(cd "$src" && pwd)
[[ -f $src/include/rseq/rseq.h ]] || { echo "bench_librseq: $src is not a librseq clone" >&2; exit 2; }
out=$root/build/librseq
mkdir -p "$out"

missing=()
for p in autoconf automake libtool; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  [[ $(id -u) -eq 0 ]] || { echo "bench_librseq: run: apt-get install -y ${missing[*]}" >&2; exit 1; }
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >/dev/null
fi

if [[ ! -f $out/prefix/lib/librseq.a ]]; then
  echo "bench_librseq: building librseq from $src ($(git -C "$src" log --oneline -1 2>/dev/null || echo 'not a git checkout'))"
  rm -rf "$out/src" && cp -r "$src" "$out/src"
  (cd "$out/src" && ./bootstrap && ./configure --prefix="$out/prefix" --disable-shared --disable-numa &&
     make -j"$(nproc)" && make install) >"$out/librseq-build.log" 2>&1 ||
    { tail -30 "$out/librseq-build.log"; exit 1; }
fi

# percpu's static library, Release, as a user's build makes it.
cmake -S "$root" -B "$out/percpu" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF \
  -DPERCPU_BUILD_TOOLS=OFF -DPERCPU_BUILD_BENCHMARKS=OFF -DPERCPU_BUILD_EXAMPLES=OFF \
  >"$out/percpu-configure.log" 2>&1 || { cat "$out/percpu-configure.log"; exit 1; }
cmake --build "$out/percpu" -j"$(nproc)" >"$out/percpu-build.log" 2>&1 ||
  { tail -30 "$out/percpu-build.log"; exit 1; }

for flags in "" "-falign-loops=64"; do
  name=side_by_side${flags:+_aligned}
  gcc -O2 $flags -I"$out/prefix/include" -c "$root/benchmarks/librseq/librseq_loops.c" -o "$out/$name.librseq.o"
  g++ -std=c++17 -O2 $flags -I"$root" -I"$out/prefix/include" "$root/benchmarks/librseq/side_by_side.cpp" \
    "$out/$name.librseq.o" "$out/percpu/percpu/libpercpu.a" "$out/prefix/lib/librseq.a" -lpthread -ldl \
    -o "$out/$name"
  # First with glibc's registration shared by both, then with librseq's own
  # (glibc's off), which percpu then shares.
  "$out/$name" "$rounds" "g++ -O2 ${flags:-(default alignment)}; glibc registers rseq"
  echo
  GLIBC_TUNABLES=glibc.pthread.rseq=0 "$out/$name" "$rounds" \
    "g++ -O2 ${flags:-(default alignment)}; librseq registers rseq (GLIBC_TUNABLES=glibc.pthread.rseq=0)"
  echo
done
