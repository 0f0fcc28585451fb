#!/usr/bin/env bash
# scripts/bench.sh [percpu-bench options]: the main job. Builds percpu in
# Release and runs percpu-bench, which prints the two seed patches' tables
# measured on this machine beside every alternative. Options are passed on
# (see scripts/bench.sh --help), e.g. --calls 100000000 --json out.json.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/deps.sh" build
build="$root/build/release"
mkdir -p "$root/build"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF \
      -DPERCPU_BUILD_TOOLS=ON -DPERCPU_BUILD_BENCHMARKS=OFF -DPERCPU_BUILD_EXAMPLES=OFF \
      >"$build.configure.log" 2>&1 || { cat "$build.configure.log"; exit 1; }
cmake --build "$build" --target percpu-bench -j "$(nproc)" >"$build.build.log" 2>&1 ||
  { tail -40 "$build.build.log"; exit 1; }
exec "$build/tools/percpu-bench" "$@"
