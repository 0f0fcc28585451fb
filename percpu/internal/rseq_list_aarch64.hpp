// aarch64 rseq section for the object pool. Included only by
// percpu/internal/rseq_list.hpp. Layout, labels, signature, scratch registers
// and seams as in rseq_cs_aarch64.hpp (labels 1 start, 2 post-commit,
// 3 descriptor, 4 abort, 5/6 delay loop, 7 compare-twice).
#pragma once

#include <cstdint>

namespace percpu {
namespace internal {

// rseq_cmpeqv_cmpeqv_storev: double compare, one store.
//
//   pseudo-code:   if (area->index != index) return -1;
//                  if (*v != expect) return 1;
//                  if (*v2 != expect2) return 1;
//                  *v = newv;                       <- commit
//                  return 0;
//   operands:      area -> %[area], v -> %[v], expect -> %[expect],
//                  v2 -> %[v2], expect2 -> %[expect2], newv -> %[newv],
//                  index -> %w[index], x9 descriptor address, w10/x10 loaded values
//   labels:        start 1, commit "str %[newv], [%[v]]", post-commit 2,
//                  abort 4 -> C label abort (-1), exit cmpfail (1)
//   Order matters: *v2 is read only after *v matched (see the x86-64 file).
//   Both loads are on the CPU that owns the list, which sees its own stores in
//   order; other CPUs reach the list only through the fenced lock protocol.
template <index_kind K>
inline int rseq_cmpeqv_cmpeqv_storev(rseq_area* area, std::intptr_t* v, std::intptr_t expect,
                                     std::intptr_t* v2, std::intptr_t expect2,
                                     std::intptr_t newv, int index) noexcept {
  asm goto(
      ".pushsection __rseq_cs, \"aw?\"\n\t"
      ".balign 32\n\t"
      "3:\n\t"
      ".long 0x0, 0x0\n\t"
      ".quad 1f, 2f - 1f, 4f\n\t"
      ".popsection\n\t"
      ".pushsection __rseq_cs_ptr_array, \"aw?\"\n\t"
      ".quad 3b\n\t"
      ".popsection\n\t"
      ".pushsection __rseq_exit_point_array, \"aw?\"\n\t"
      ".quad 1f, %l[abort]\n\t"
      ".quad 1f, %l[cmpfail]\n\t"
      ".popsection\n\t"
      "adrp x9, 3b\n\t"
      "add x9, x9, :lo12:3b\n\t"
      "str x9, [%[area], %c[cs_offset]]\n\t"
      "1:\n\t"
      "ldr w10, [%[area], %c[index_offset]]\n\t"
      "cmp w10, %w[index]\n\t"
      "b.ne %l[abort]\n\t"
      "ldr x10, [%[v]]\n\t"
      "cmp x10, %[expect]\n\t"
      "b.ne %l[cmpfail]\n\t"
      "ldr x10, [%[v2]]\n\t"
      "cmp x10, %[expect2]\n\t"
      "b.ne %l[cmpfail]\n\t"
#if defined(PERCPU_INJECT_DELAYS)
      "mov w11, %w[delay]\n\t"
      "5:\n\t"
      "cbz w11, 6f\n\t"
      "sub w11, w11, #1\n\t"
      "b 5b\n\t"
      "6:\n\t"
#endif
#if defined(PERCPU_COMPARE_TWICE)
      "ldr w11, [%[area], %c[index_offset]]\n\t"
      "cmp w11, %w[index]\n\t"
      "b.eq 7f\n\t"
      "brk #0x7\n\t"
      "7:\n\t"
#endif
      "str %[newv], [%[v]]\n\t"
      "2:\n\t"
      ".pushsection __rseq_failure, \"ax?\"\n\t"
      ".inst " PERCPU_RSEQ_SIG_STRING "\n\t"
      "4:\n\t"
      "b %l[abort]\n\t"
      ".popsection\n\t"
      :
      : [area] "r"(area), [v] "r"(v), [expect] "r"(expect), [v2] "r"(v2),
        [expect2] "r"(expect2), [newv] "r"(newv), [index] "r"(index),
        [cs_offset] "i"(kRseqCsOffset), [index_offset] "i"(index_offset<K>())
#if defined(PERCPU_INJECT_DELAYS)
        , [delay] "r"(inject_delay_loops())
#endif
      : "memory", "cc", "x9", "x10", "x11"
      : abort, cmpfail);
  return 0;
abort:
  return -1;
cmpfail:
  return 1;
}

}  // namespace internal
}  // namespace percpu
