// Do not include directly; not a stable API (internal to percpu).
//
// Dispatcher: the thread-pointer-relative loads behind percpu's fast paths.
//
// Exactly one architecture file is included (each refuses to be included
// any other way). Each provides, in namespace percpu::internal:
//   char* thread_pointer() noexcept;                     // the ABI thread pointer
//   std::int32_t load_tp_relative_i32(std::intptr_t) noexcept;
//       a single load of the 32-bit word at thread_pointer() + offset, never
//       merged with another load and never hoisted out of a loop, because the
//       kernel rewrites that word behind the compiler's back.
//   unsigned rdpid_tsc_aux() noexcept;
//       the x86-64 RDPID instruction, for the inline RDPID fallback (only
//       called where config.hpp's kArchHasRdpid is true).
#pragma once

#include "percpu/internal/config.hpp"

#define PERCPU_INTERNAL_THREAD_POINTER_DISPATCH 1
#if defined(__x86_64__)
#include "percpu/internal/thread_pointer_x86_64.hpp"
#elif defined(__aarch64__)
#include "percpu/internal/thread_pointer_aarch64.hpp"
#else
#include "percpu/internal/thread_pointer_generic.hpp"
#endif
#undef PERCPU_INTERNAL_THREAD_POINTER_DISPATCH
