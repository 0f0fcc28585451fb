// Makes rseq(2) fail in the calling process and everything it execs.
//
// Kernels and sandboxes without rseq look exactly like this to glibc and to
// percpu, so this is how both the tests (tests/seccomp_exec) and
// percpu-bench's "without rseq" column get a process with no rseq on a
// kernel that has it. One copy of the filter, shared by both, so the two
// cannot drift apart.
#pragma once

namespace percpu {
namespace tools {

// Installs a seccomp filter (after PR_SET_NO_NEW_PRIVS, so no privilege is
// needed) that returns `error` from rseq(2) and allows every other system
// call. The filter survives execve and cannot be removed. Returns false with
// errno set when the kernel refuses it.
bool deny_rseq(int error) noexcept;

}  // namespace tools
}  // namespace percpu
