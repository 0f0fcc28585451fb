// Do not include directly; not a stable API (internal to percpu).
//
// Finding a function in the vDSO the kernel maps into every process.
//
// The image is located through the auxiliary vector (AT_SYSINFO_EHDR) and
// read as the ELF file it is; no libc support is needed, so this works on any
// glibc and under any dynamic loader. Thread-safe and async-signal-safe (it
// only reads memory), but callers should look a symbol up once and keep it.
#pragma once

namespace percpu {
namespace internal {

// The address of the vDSO's exported function `name` (with symbol version
// `version`, or any version when null), or nullptr when there is no vDSO, no
// such symbol, or the image is not what this parser expects.
void* vdso_symbol(const char* name, const char* version) noexcept;

}  // namespace internal
}  // namespace percpu
