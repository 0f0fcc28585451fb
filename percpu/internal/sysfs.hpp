// Do not include directly; not a stable API (internal to percpu).
//
// Bounds on the CPU ids the kernel can report, behind percpu::max_cpus().
// Async-signal-safe: yes (reads and system calls only).
#pragma once

namespace percpu {
namespace internal {

// One more than the highest CPU id in a kernel CPU list such as "0-3,8-11\n"
// (the format of /sys/devices/system/cpu/possible), or 0 when `text` is not
// such a list.
int cpu_list_bound(const char* text) noexcept;

// The number of bits in the kernel's cpumask (a bound on every CPU id it can
// report), from the raw sched_getaffinity system call; 0 if it fails.
int kernel_cpumask_bits() noexcept;

// The bound max_cpus() caches: the sysfs list of possible CPUs where /sys is
// there, else the kernel's cpumask size, else the configured count; raised
// to cover the id the kernel reports now and every CPU the calling thread
// may run on. Sets *bounds_every_id to whether the bound covers every id the
// kernel can report: a possible list read from sysfs itself (a file
// bind-mounted over it could say less) that covers those CPUs, or the
// cpumask size; not the configured count, nor a source that had to be raised.
int read_max_cpus(bool* bounds_every_id) noexcept;

// What read_max_cpus() said of the bound percpu::max_cpus() caches
// (defined beside it, in cpu.cpp).
bool max_cpus_bounds_every_id() noexcept;

}  // namespace internal
}  // namespace percpu
