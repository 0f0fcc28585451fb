#!/usr/bin/env python3
"""Median ratio of two Google Benchmark families, taken within each run.

  scripts/structure_ratios.py RUNS NUMERATOR DENOMINATOR -- BENCHMARK_COMMAND...

Runs BENCHMARK_COMMAND (a *_benchmark binary with its flags, optionally
behind build/dev/tests/seccomp_exec ENOSYS) RUNS times with
--benchmark_format=json. In each run, for every thread count, it divides the
cpu_time of the benchmark whose name matches the NUMERATOR regex by that of
the DENOMINATOR one, and prints the median of those per-run ratios with the
median times. CPU time, not wall time: on a shared machine the wall clock
counts other programs' time too. A run that crashes is skipped and reported.
Give the alternative as NUMERATOR and percpu's benchmark as DENOMINATOR, the
direction percpu-bench --structures prints: above 1, percpu is faster.
"""
import json
import re
import statistics
import subprocess
import sys


def main():
    if len(sys.argv) < 6 or sys.argv[4] != "--":
        sys.exit(__doc__)
    runs, num, den, cmd = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[5:]
    ratios = {}
    for _ in range(runs):
        out = subprocess.run(cmd + ["--benchmark_format=json"], capture_output=True,
                             text=True).stdout
        try:
            data = json.loads(out)
        except ValueError:
            print("  (a run crashed or printed no JSON; skipped)")
            continue
        times = {b["name"]: b["cpu_time"] for b in data["benchmarks"]}

        def threads(name):
            return name.split("threads:")[1] if "threads:" in name else "1"

        for name, t in times.items():
            if not re.match(num, name):
                continue
            for other, u in times.items():
                if re.match(den, other) and threads(other) == threads(name):
                    ratios.setdefault(threads(name), []).append((t / u, t, u))
    for th, values in sorted(ratios.items()):
        print("threads %s: median ratio %.3f  (%.2f ns / %.2f ns, %d runs)" % (
            th, statistics.median(v[0] for v in values),
            statistics.median(v[1] for v in values),
            statistics.median(v[2] for v in values), len(values)))


if __name__ == "__main__":
    main()
