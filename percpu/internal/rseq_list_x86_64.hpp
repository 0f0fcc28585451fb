// x86-64 rseq section for the object pool. Included only by
// percpu/internal/rseq_list.hpp. Layout, labels, signature and seams as in
// rseq_cs_x86_64.hpp (labels 1 start, 2 post-commit, 3 descriptor, 4 abort,
// 5/6 delay loop, 7 compare-twice).
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
//                  index -> %[index], %rax descriptor address
//   labels:        start 1, commit "movq %[newv], (%[v])", post-commit 2,
//                  abort 4 -> C label abort (-1), exit cmpfail (1)
//   Order matters: *v2 is read only after *v matched, because the pool's v2
//   lives in the node *v points to, which is stable only while it is the head.
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
      "leaq 3b(%%rip), %%rax\n\t"
      "movq %%rax, %c[cs_offset](%[area])\n\t"
      "1:\n\t"
      "cmpl %[index], %c[index_offset](%[area])\n\t"
      "jne %l[abort]\n\t"
      "cmpq %[expect], (%[v])\n\t"
      "jne %l[cmpfail]\n\t"
      "cmpq %[expect2], (%[v2])\n\t"
      "jne %l[cmpfail]\n\t"
#if defined(PERCPU_INJECT_DELAYS)
      "movl %[delay], %%ecx\n\t"
      "5:\n\t"
      "testl %%ecx, %%ecx\n\t"
      "jz 6f\n\t"
      "decl %%ecx\n\t"
      "jmp 5b\n\t"
      "6:\n\t"
#endif
#if defined(PERCPU_COMPARE_TWICE)
      "cmpl %[index], %c[index_offset](%[area])\n\t"
      "je 7f\n\t"
      "ud2\n\t"
      "7:\n\t"
#endif
      "movq %[newv], (%[v])\n\t"
      "2:\n\t"
      ".pushsection __rseq_failure, \"ax?\"\n\t"
      ".byte 0x0f, 0xb9, 0x3d\n\t"
      ".long " PERCPU_RSEQ_SIG_STRING "\n\t"
      "4:\n\t"
      "jmp %l[abort]\n\t"
      ".popsection\n\t"
      :
      : [area] "r"(area), [v] "r"(v), [expect] "r"(expect), [v2] "r"(v2),
        [expect2] "r"(expect2), [newv] "r"(newv), [index] "r"(index),
        [cs_offset] "i"(kRseqCsOffset), [index_offset] "i"(index_offset<K>())
#if defined(PERCPU_INJECT_DELAYS)
        , [delay] "r"(inject_delay_loops())
#endif
      : "memory", "cc", "rax", "rcx"
      : abort, cmpfail);
  return 0;
abort:
  return -1;
cmpfail:
  return 1;
}

}  // namespace internal
}  // namespace percpu
