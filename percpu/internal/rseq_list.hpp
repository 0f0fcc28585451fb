// Dispatcher: the one rseq section percpu's object pool needs beyond the
// layer in rseq_cs.hpp, kept in its own files so that layer stays as it is.
//
// Exactly one architecture file is included: rseq_list_x86_64.hpp,
// rseq_list_aarch64.hpp, or rseq_list_fallback.hpp (always an abort).
//
//   template <index_kind K>
//   int rseq_cmpeqv_cmpeqv_storev(rseq_area* area, intptr_t* v, intptr_t expect,
//                                 intptr_t* v2, intptr_t expect2, intptr_t newv,
//                                 int index) noexcept;
//       if (*v == expect && *v2 == expect2) *v = newv;      double compare, one store
//
// Why the pool needs it: its per-CPU caches are bounded, so every free object
// on a cache carries its depth. A push reads the head h and h's depth d
// outside the section, writes depth d + 1 into the new node, and commits only
// if the head is still h and h's depth is still d. Comparing the head alone
// would let h leave and come back at another depth in between (ABA on the
// depth); with both compared, a head that came back at the same depth sits on
// a list of the same length, so the new depth is exact.
//
// Return values, section layout, descriptor tables and test seams are exactly
// those of rseq_cs.hpp. Async-signal-safe: yes.
#pragma once

#include <cstdint>

#include "percpu/internal/rseq_cs.hpp"

#if defined(__x86_64__)
#include "percpu/internal/rseq_list_x86_64.hpp"
#elif defined(__aarch64__)
#include "percpu/internal/rseq_list_aarch64.hpp"
#else
#include "percpu/internal/rseq_list_fallback.hpp"
#endif
