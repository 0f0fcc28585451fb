// Dispatcher: the thread-pointer-relative loads behind percpu's fast paths.
//
// Exactly one architecture file is included. Each provides, in namespace
// percpu::internal:
//   constexpr bool kArchHasRseq;                         // percpu knows this arch's signature
//   char* thread_pointer() noexcept;                     // the ABI thread pointer
//   std::int32_t load_tp_relative_i32(std::intptr_t) noexcept;
//       a single load of the 32-bit word at thread_pointer() + offset, never
//       merged with another load and never hoisted out of a loop, because the
//       kernel rewrites that word behind the compiler's back.
//   constexpr bool kArchHasRdpid; unsigned rdpid_tsc_aux() noexcept;
//       the x86-64 RDPID instruction, for the inline RDPID fallback.
#pragma once

#if defined(__x86_64__)
#include "percpu/internal/thread_pointer_x86_64.hpp"
#elif defined(__aarch64__)
#include "percpu/internal/thread_pointer_aarch64.hpp"
#else
#include "percpu/internal/thread_pointer_generic.hpp"
#endif
