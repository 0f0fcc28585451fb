#!/bin/bash
# run.sh: installs percpu into a temporary prefix and builds the consumer
# project against it twice, as a user would: with find_package(percpu CONFIG
# REQUIRED) and with pkg-config. Runs every consumer binary.
#
#   tests/consumer/run.sh [SOURCE_DIR] [extra cmake arguments for percpu...]
#
# SOURCE_DIR defaults to the checkout this script is in. Extra arguments go
# to percpu's configure step (e.g. -DBUILD_SHARED_LIBS=ON). Keeps the temp
# directory on failure and names it. Exit status non-zero on any failure.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
src=$(cd "${1:-$here/../..}" && pwd)
shift || true
work=$(mktemp -d "${TMPDIR:-/tmp}/percpu-consumer.XXXXXX")
trap 'status=$?; if [[ $status -eq 0 ]]; then rm -rf "$work"; else echo "run.sh: failed; left $work" >&2; fi' EXIT
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
jobs=${PERCPU_CONSUMER_JOBS:-2}

step() { echo "== $*"; }

step "install percpu into $work/prefix"
cmake -S "$src" -B "$work/build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DBUILD_TESTING=OFF -DPERCPU_BUILD_TOOLS=OFF -DCMAKE_INSTALL_PREFIX="$work/prefix" "$@" >"$work/configure.log"
cmake --build "$work/build" -j "$jobs" >"$work/build.log"
cmake --install "$work/build" >"$work/install.log"

step "consumer with find_package(percpu CONFIG REQUIRED)"
cmake -S "$here" -B "$work/consumer-cmake" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$work/prefix" >"$work/consumer-configure.log"
cmake --build "$work/consumer-cmake" -j "$jobs" >"$work/consumer-build.log"
"$work/consumer-cmake/percpu_consumer"
"$work/consumer-cmake/percpu_c_consumer"

step "consumer with pkg-config --cflags --libs percpu"
pc=$(find "$work/prefix" -name percpu.pc -print -quit)
[[ -n $pc ]] || { echo "run.sh: no percpu.pc was installed" >&2; exit 1; }
PKG_CONFIG_PATH=$(dirname "$pc") make -s -C "$here" BUILD="$work/consumer-pc"
LD_LIBRARY_PATH=$(dirname "$(dirname "$pc")")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} \
  "$work/consumer-pc/percpu_consumer"
LD_LIBRARY_PATH=$(dirname "$(dirname "$pc")")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} \
  "$work/consumer-pc/percpu_c_consumer"
echo "consumer builds: ok"
