#!/usr/bin/env bash
# scripts/host_report.sh: what this host offers that percpu uses, one line
# each, so that a test report says where it ran. scripts/test.sh prints it
# before the lanes. Reads only; never fails the run.
set -uo pipefail

flags=$(grep -m1 -E '^(flags|Features)[[:space:]]*:' /proc/cpuinfo 2>/dev/null | cut -d: -f2)
has() { grep -qw "$1" <<<"$flags" && echo yes || echo no; }
model=$(grep -m1 -E '^(model name|CPU part)[[:space:]]*:' /proc/cpuinfo 2>/dev/null | cut -d: -f2 | sed 's/^ *//')

echo "Host:"
echo "  cpu:      ${model:-unknown} ($(uname -m), $(nproc 2>/dev/null || echo '?') online," \
  "possible $(cat /sys/devices/system/cpu/possible 2>/dev/null || echo 'unknown: no /sys'))"
if [ "$(uname -m)" = x86_64 ]; then
  echo "  flags:    rdpid=$(has rdpid) rdtscp=$(has rdtscp) (the RDPID fallback needs rdpid; without it the" \
    "*.emulated_rdpid variants cover it)"
fi
echo "  kernel:   $(uname -r)"
echo "  glibc:    $(getconf GNU_LIBC_VERSION 2>/dev/null || echo unknown)"
# The rest asks the kernel directly: AT_RSEQ_FEATURE_SIZE (27) from the
# auxiliary vector, and membarrier's command query.
python3 - <<'PY' 2>/dev/null || echo "  (rseq and membarrier: python3 missing, not reported)"
import ctypes, os, platform, struct
aux = open("/proc/self/auxv", "rb").read()
vals = dict(struct.iter_unpack("QQ", aux))
size = vals.get(27, 0)
have = [f for f, need in (("node_id", 24), ("mm_cid", 28)) if size >= need]
print("  rseq:     feature size %s%s" % (size or "not reported (Linux < 6.3: 20)",
      "; fields node_id, mm_cid: " + (", ".join(have) if have else "neither")))
nr = {"x86_64": 324, "aarch64": 283}.get(platform.machine())
if nr:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    q = libc.syscall(ctypes.c_long(nr), ctypes.c_int(0), ctypes.c_uint(0), ctypes.c_int(0))
    names = {1: "GLOBAL", 2: "GLOBAL_EXPEDITED", 8: "PRIVATE_EXPEDITED",
             32: "PRIVATE_EXPEDITED_SYNC_CORE", 128: "PRIVATE_EXPEDITED_RSEQ"}
    if q < 0:
        print("  membarrier: unavailable (errno %d)" % ctypes.get_errno())
    else:
        print("  membarrier: " + " ".join(n for b, n in sorted(names.items()) if q & b))
PY
