#!/usr/bin/env bash
# scripts/deps.sh GROUP...: makes sure the Debian packages a job needs are
# installed. As root it installs what is missing; otherwise it prints the
# exact apt-get line and fails.
#
# Groups: build (compiler, CMake, GoogleTest, Google Benchmark, CLI11,
#                nlohmann-json for percpu-bench's JSON),
#         clang (with its sanitizer runtimes), valgrind, aarch64 (cross compiler, qemu-user, qemu-system),
#         allocators (jemalloc, gperftools' tcmalloc, mimalloc),
#         sync (TBB and liburcu, the benchmarks of shared_mutex and ref),
#         gbench-tools (Google Benchmark's compare.py and the scipy it needs:
#                percpu_bench_test runs it on percpu-bench --gbench-json),
#         abi (abigail-tools: abidw and abidiff, scripts/abi.sh).
set -euo pipefail

packages=()
for group in "$@"; do
  case "$group" in
    build) packages+=(build-essential cmake ninja-build pkg-config libgtest-dev libbenchmark-dev
                      libcli11-dev nlohmann-json3-dev binutils python3) ;;
    clang) packages+=(clang libclang-rt-dev) ;;  # the runtime: clang's -fsanitize=thread|address|memory
    valgrind) packages+=(valgrind) ;;
    aarch64) packages+=(g++-aarch64-linux-gnu qemu-user qemu-system-arm cpio) ;;
    allocators) packages+=(libjemalloc-dev libgoogle-perftools-dev libmimalloc-dev) ;;
    sync) packages+=(libtbb-dev liburcu-dev) ;;
    gbench-tools) packages+=(libbenchmark-tools python3-scipy) ;;
    abi) packages+=(abigail-tools) ;;
    *) echo "deps.sh: unknown group '$group'" >&2; exit 2 ;;
  esac
done

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
  echo "percpu needs these Debian packages; run:" >&2
  echo "  sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi
echo "deps.sh: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
