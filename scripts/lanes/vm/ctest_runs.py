#!/usr/bin/env python3
"""Turns a build's ctest list into the aarch64-system lane's run list (the
`run` lines of scripts/lanes/vm/init.sh), so the VM runs exactly the tests,
mode variants, arguments and environments that CMake registered, and copies
the files those runs need into the initramfs tree, path for path.

    ctest_runs.py --json tests.json --root ROOT [--include RE] [--exclude RE]
                  [--require NAME...] [--env VAR=VALUE...] [--timeout-factor N]

tests.json is `ctest --show-only=json-v1`; the list goes to ROOT/lane/runs.
A test whose command is not an aarch64 program of the build tree (cmake, a
script) cannot run in the VM: it is named on stdout, and the lane fails when
it is a required one.
"""
import argparse
import json
import os
import re
import shlex
import shutil
import sys

# What passing means under these properties is more than an exit status; the
# run list cannot say it, so a test using one must not be run as if it could.
UNSUPPORTED = {"ENVIRONMENT_MODIFICATION", "FIXTURES_REQUIRED", "RESOURCE_LOCK", "DEPENDS",
               "WILL_FAIL", "PASS_REGULAR_EXPRESSION", "FAIL_REGULAR_EXPRESSION",
               "SKIP_RETURN_CODE", "SKIP_REGULAR_EXPRESSION"}


def aarch64_elf(path):
    with open(path, "rb") as f:
        head = f.read(20)
    # 64-bit little-endian ELF, e_machine AArch64.
    return head[:6] == b"\x7fELF\x02\x01" and head[18:20] == b"\xb7\x00"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", required=True)
    ap.add_argument("--root", required=True)
    ap.add_argument("--include", default="")
    ap.add_argument("--exclude", default="")
    ap.add_argument("--require", nargs="*", default=[])
    ap.add_argument("--env", nargs="*", default=[])
    ap.add_argument("--timeout-factor", type=int, default=1)
    args = ap.parse_args()

    lines, files, dirs, cannot = [], set(), set(), []
    for test in json.load(open(args.json))["tests"]:
        name, command = test["name"], test.get("command", [])
        if args.include and not re.search(args.include, name):
            continue
        if args.exclude and re.search(args.exclude, name):
            print(f"excluded by the lane's EXCLUDE regex: {name}")
            continue
        # The program and every file it is given must be files of this machine.
        given = [a for a in command if os.path.isabs(a) and os.path.isfile(a)]
        if not command or command[0] not in given or not aarch64_elf(command[0]):
            cannot.append(name)
            continue
        programs = [a for a in given if aarch64_elf(a)]
        under_seccomp = any(os.path.basename(a) == "seccomp_exec" for a in programs)
        prints_mode = any(b"percpu test mode: rseq owner=" in open(a, "rb").read()
                          for a in programs if os.path.basename(a) != "seccomp_exec")
        props = {p["name"]: p["value"] for p in test.get("properties", [])}
        used = UNSUPPORTED & props.keys()
        if used:
            sys.exit(f"test {name} uses {', '.join(sorted(used))}, which the VM's /init does "
                     "not implement; teach scripts/lanes/vm/init.sh and ctest_runs.py about it")
        env = props.get("ENVIRONMENT", []) + args.env
        settings = dict(e.split("=", 1) for e in env)
        timeout = int(float(props.get("TIMEOUT", 300))) * args.timeout_factor
        flags = [f"timeout={timeout}"]
        if "WORKING_DIRECTORY" in props:
            flags.append(f"cwd={props['WORKING_DIRECTORY']}")
            dirs.add(props["WORKING_DIRECTORY"])
        if prints_mode:
            flags.append("mode")
        # rseq must serve every run but those that take it away (seccomp),
        # expect it gone, or force a fallback backend.
        if (not under_seccomp and settings.get("PERCPU_EXPECT_OWNER") != "none"
                and settings.get("PERCPU_BACKEND", "rseq") == "rseq"):
            flags.append("rseq")
        words = [name] + flags + ["--"] + env + command
        lines.append("run " + " ".join(shlex.quote(w) for w in words))
        files.update(given)

    for name in cannot:
        print(f"not an aarch64 program of the build, cannot run in the VM: {name}")
    if args.include or args.exclude:
        print(f"partial run: INCLUDE='{args.include}' EXCLUDE='{args.exclude}'; required tests not enforced")
    else:
        for name in args.require:
            if not any(line.split()[1] == name for line in lines):
                sys.exit(f"required test {name} is not in the VM's run list")
    if not lines:
        sys.exit("no test of the build can run in the VM")
    for path in files:
        os.makedirs(args.root + os.path.dirname(path), exist_ok=True)
        shutil.copy2(path, args.root + path)
    for path in dirs:
        os.makedirs(args.root + path, exist_ok=True)
    with open(os.path.join(args.root, "lane", "runs"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"VM runs ({len(lines)}): {' '.join(line.split()[1] for line in lines)}")


if __name__ == "__main__":
    main()
