// Architectures without percpu rseq support. Included only by
// percpu/internal/rseq_list.hpp. rseq_area_for_sections() is always nullptr
// there, so this is never reached; it reports an abort without storing.
#pragma once

#include <cstdint>

namespace percpu {
namespace internal {

template <index_kind K>
inline int rseq_cmpeqv_cmpeqv_storev(rseq_area*, std::intptr_t*, std::intptr_t, std::intptr_t*,
                                     std::intptr_t, std::intptr_t, int) noexcept {
  return -1;
}

}  // namespace internal
}  // namespace percpu
