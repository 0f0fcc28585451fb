#!/usr/bin/env python3
"""Turns the kernels lane's serial logs into its compatibility table.

Each log is what vm/init.sh printed in one VM (or on this machine): a kernel line,
then per run "TAG: RUN name", the test's own output (with expect_mode.cpp's
"percpu test mode: ..." line) and "TAG: PASS|FAIL name (...)". Run names are
GLIBC/MODE/TEST (scripts/lanes/kernels.sh). Runs are grouped by kernel, arch,
glibc and mode; each row says how many passed and what percpu reported.

Exit status 1 when any run failed, a VM did not finish, or a run that should
have had an rseq registration reported none.
"""
import argparse
import datetime
import os
import re
import sys

MODE_LINE = re.compile(
    r"percpu test mode: rseq owner=(\S+), main thread backend=(\S+), fallback=\S+, "
    r"feature size=(\d+), max_cpus=\d+, registration=(\d+) \((\w+)\), sections=(\w+)")
MODE_ORDER = ["glibc", "own", "other", "fallback", "sections-off"]
MODE_HELP = {
    "glibc": "glibc registers rseq (static: the build's glibc)",
    "own": "GLIBC_TUNABLES=glibc.pthread.rseq=0: percpu registers its own area",
    "other": "another library registered first (test registrants: librseq's and tcmalloc's conventions)",
    "fallback": "seccomp makes rseq fail with ENOSYS",
    "sections-off": "PERCPU_RSEQ_SECTIONS=off: structures on their no-rseq paths, cpu_id() on rseq",
}
# Modes in which every run must have had an rseq registration.
NEEDS_RSEQ = {"glibc", "own", "other", "sections-off"}


def parse(path, tag):
    kernel, arch, runs, summary, qemu_exit = None, None, [], None, 0
    current = None
    with open(path, errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            if line.startswith(tag + ": kernel "):
                parts = line.split()
                kernel, arch = parts[3], parts[-1]
            elif line.startswith(tag + ": RUN "):
                current = {"name": line.split(" ", 2)[2], "mode": None, "passed": None, "why": ""}
                runs.append(current)
            elif re.match(re.escape(tag) + r": (PASS|FAIL) ", line):
                verdict, name = line.split(" ")[1:3]
                for r in reversed(runs):
                    if r["name"] == name:
                        r["passed"] = verdict == "PASS"
                        r["why"] = line.split(" ", 3)[3] if verdict == "FAIL" else ""
                        break
                current = None
            elif re.match(re.escape(tag) + r": \d+ passed, \d+ failed$", line):
                summary = line
            elif line.startswith("qemu_exit "):
                qemu_exit = int(line.split()[1])
            elif current is not None and current["mode"] is None:
                m = MODE_LINE.search(line)
                if m:
                    current["mode"] = m.groups()
    return kernel, arch, runs, summary, qemu_exit


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tag", required=True)
    ap.add_argument("--commit", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("logs", nargs="+")
    args = ap.parse_args()

    rows, problems = [], []
    for path in args.logs:
        where = os.path.basename(path)[:-4]
        kernel, arch, runs, summary, qemu_exit = parse(path, args.tag)
        host = where.endswith("-host")
        if kernel is None:
            problems.append(f"{where}: no kernel line (the VM did not start init)")
            continue
        if summary is None:
            problems.append(f"{where}: no summary line (the VM crashed, hung or was cut off)")
        if qemu_exit != 0:
            problems.append(f"{where}: qemu exited with status {qemu_exit}")
        groups = {}
        for r in runs:
            glibc, mode, test = r["name"].split("/")
            if r["passed"] is None:
                problems.append(f"{where} {kernel}: {r['name']} never finished")
            elif not r["passed"]:
                problems.append(f"{where} {kernel}: {r['name']} FAILED {r['why']}")
            if mode in NEEDS_RSEQ and r["passed"] and (r["mode"] is None or r["mode"][3] == "0"):
                problems.append(f"{where} {kernel}: {r['name']} should have had rseq and had none")
            groups.setdefault((glibc, mode), []).append(r)
        for (glibc, mode), group in groups.items():
            seen = [r["mode"] for r in group if r["mode"]]
            def values(i):
                return "/".join(sorted({m[i] for m in seen})) or "?"
            regs = sorted({f"{m[3]} ({m[4]})" if m[3] != "0" else "none" for m in seen})
            passed = sum(1 for r in group if r["passed"])
            rows.append({
                "kernel": kernel + (" (this machine)" if host else ""),
                "arch": arch,
                "glibc": glibc.replace("glibc-", "") if glibc != "static" else "2.36 static",
                "mode": mode,
                "result": f"{'pass' if passed == len(group) else 'FAIL'} {passed}/{len(group)}",
                "owner": values(0),
                "registration": "/".join(regs) or "?",
                "feature": values(2),
                "backend": values(1),
                "sections": values(5),
                "tests": ", ".join(sorted({r["name"].split("/")[2] for r in group})),
            })

    def version_key(text):
        return [int(x) if x.isdigit() else x for x in re.split(r"[.\-+~ ]", text)]
    rows.sort(key=lambda r: (version_key(r["kernel"]), r["arch"], r["glibc"] != "2.36 static",
                             version_key(r["glibc"]), MODE_ORDER.index(r["mode"])
                             if r["mode"] in MODE_ORDER else 99))
    columns = [("kernel", "kernel"), ("arch", "arch"), ("glibc", "glibc"), ("mode", "mode"),
               ("result", "result"), ("owner", "rseq owner"), ("registration", "registration (mode)"),
               ("feature", "feature size"), ("backend", "backend"), ("sections", "sections")]
    table = ["| " + " | ".join(h for _, h in columns) + " |",
             "|" + "|".join("---" for _ in columns) + "|"]
    for r in rows:
        table.append("| " + " | ".join(r[k] for k, _ in columns) + " |")

    today = datetime.date.today().isoformat()
    tests = sorted({t for r in rows for t in r["tests"].split(", ")})
    doc = [
        "# Kernels and glibc versions: compatibility table",
        "",
        f"Generated by the `kernels` lane (`scripts/test.sh --lane kernels`) on {today} "
        f"at commit {args.commit}. Do not edit by hand.",
        "",
        "Each row is one group of runs of percpu's tests on one kernel, architecture, glibc and "
        "mode. The kernels are Debian's cloud kernels booted in qemu-system "
        "(x86-64 under TCG, arm64 `-M virt -cpu max`, 2 CPUs); \"this machine\" is the CI "
        "host's own kernel. `2.36 static` runs are statically linked against the build's glibc; "
        "the other glibcs are Debian's, with the tests started through that glibc's own dynamic "
        "loader. Linux 7.2 runs boot with `rseq_debug=1`, where the kernel kills a task that "
        "writes a field it owns or makes a system call inside a critical section.",
        "",
        "Modes: " + "; ".join(f"**{m}**: {MODE_HELP[m]}" for m in MODE_ORDER) + ".",
        "",
        "Columns: *rseq owner* and *backend* as percpu reports them on the main thread; "
        "*registration* is the length the thread's rseq area is registered with, as the kernel "
        "confirms it (more than 32 bytes is Linux 7.0+'s strict V2 mode, 32 the legacy mode); "
        "*feature size* is AT_RSEQ_FEATURE_SIZE (20 before Linux 6.3); *sections* is "
        "`percpu::sections_status()` on the main thread: `on` when the per-CPU structures ran "
        "rseq critical sections, otherwise why not (`no_rseq`, `disabled_by_environment`...).",
        "",
        "Tests: " + ", ".join(f"`{t}`" for t in tests) + ".",
        "",
    ] + table + [""]
    if problems:
        doc += ["Problems in this run:", ""] + [f"- {p}" for p in problems] + [""]
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        f.write("\n".join(doc))

    print("\n".join(table))
    for p in problems:
        print(f"[{args.tag}] FAILED: {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
