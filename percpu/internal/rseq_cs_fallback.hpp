// Do not include directly; not a stable API (internal to percpu).
//
// Architectures without percpu rseq support. Included only by
// percpu/internal/rseq_cs.hpp.
//
// percpu never registers rseq here (config.hpp sets kArchHasRseq to
// false), so rseq_area_for_sections() always returns nullptr
// and callers always take their atomic path. The operations exist so that the
// same caller code compiles everywhere; each reports an abort without storing.
#pragma once

#if !defined(PERCPU_INTERNAL_RSEQ_CS_DISPATCH)
#error "include percpu/internal/rseq_cs.hpp, not this arch file"
#endif

#include <cstdint>

namespace percpu {
namespace internal {

template <index_kind K>
inline int rseq_cmpeqv_storev(rseq_area*, std::intptr_t*, std::intptr_t, std::intptr_t,
                              int) noexcept {
  return -1;
}

template <index_kind K>
inline int rseq_addv(rseq_area*, std::intptr_t*, std::intptr_t, int) noexcept {
  return -1;
}

template <index_kind K>
inline int rseq_cmpeqv_trystorev_storev(rseq_area*, std::intptr_t*, std::intptr_t, std::intptr_t*,
                                        std::intptr_t, std::intptr_t, int) noexcept {
  return -1;
}

template <index_kind K>
inline int rseq_cmpabovev_storeoffp_load(rseq_area*, std::intptr_t*, std::uintptr_t, long,
                                         std::intptr_t*, int) noexcept {
  return -1;
}

template <index_kind K>
inline int rseq_cmpnev_trystorev_storev(rseq_area*, std::intptr_t*, std::intptr_t, std::intptr_t*,
                                        std::intptr_t, int) noexcept {
  return -1;
}

template <index_kind K>
inline int rseq_cmpeqv_cmpeqv_storev(rseq_area*, std::intptr_t*, std::intptr_t, std::intptr_t*,
                                     std::intptr_t, std::intptr_t, int) noexcept {
  return -1;
}

// Started sections always abort here too.
struct section_start {
  std::uint64_t cpu;
};

inline section_start start_section() noexcept { return {0}; }
// No area: as an unregistered one.
inline std::int32_t started_area_cpu_id(section_start) noexcept { return -1; }

inline std::uint64_t started_copy_offset(section_start) noexcept { return 0; }

inline int rseq_addv_started(section_start, std::intptr_t*, std::intptr_t) noexcept {
  return -1;
}

inline int rseq_cmpeqv_storev_started(section_start, std::intptr_t*, std::intptr_t,
                                      std::intptr_t) noexcept {
  return -1;
}

inline int rseq_cmpabovev_storeoffp_load_started(section_start, std::intptr_t*, std::uintptr_t,
                                                 long, std::intptr_t*) noexcept {
  return -1;
}

inline int rseq_cmpnev_trystorev_storev_started(section_start, std::intptr_t*, std::intptr_t,
                                                std::intptr_t*, std::intptr_t) noexcept {
  return -1;
}

struct cid_start {};

inline cid_start start_cid_section() noexcept { return {}; }
inline std::int32_t started_concurrency_id(cid_start) noexcept { return -1; }

inline int rseq_addv_cid_started(cid_start, std::intptr_t*, std::uint32_t, std::intptr_t) noexcept {
  return -1;
}

inline int rseq_cmpeqv_storev_cid_started(cid_start, std::intptr_t*, std::uint32_t, std::intptr_t,
                                          std::intptr_t) noexcept {
  return -1;
}

}  // namespace internal
}  // namespace percpu
