// Makes rseq(2), or membarrier(2), fail in the calling thread, the threads
// and processes it creates afterwards, and everything they exec.
//
// Kernels and sandboxes without rseq look exactly like this to glibc and to
// percpu, so this is how the tests (tests/seccomp_exec, and cpu_test and
// counter_test for one thread of several) and percpu-bench's "without rseq"
// column get no rseq on a kernel that has it. Likewise a kernel with rseq but
// without membarrier (CONFIG_MEMBARRIER off, a sandbox refusing it; Linux
// 4.18 to 5.9 lack its RSEQ fence) is what the tests' .no_membarrier
// variants see under deny_membarrier. One filter builder, shared by all, so
// they cannot drift apart.
#pragma once

namespace percpu {
namespace tools {

// Installs a seccomp filter (after PR_SET_NO_NEW_PRIVS, so no privilege is
// needed) that returns `error` from rseq(2) and allows every other system
// call. Installed without TSYNC, it binds only the calling thread (and what
// it creates later), like a per-thread filter in a real program; called
// before any other thread exists, that is the whole process. The filter
// survives execve and cannot be removed. Returns false with
// errno set when the kernel refuses it.
bool deny_rseq(int error) noexcept;

// The same for membarrier(2): every command, MEMBARRIER_CMD_QUERY included,
// fails with `error` (ENOSYS: the kernel has no membarrier at all; EPERM: a
// sandbox refuses it). Filters stack: both may be installed.
bool deny_membarrier(int error) noexcept;

}  // namespace tools
}  // namespace percpu
