// Do not include directly; not a stable API (internal to percpu).
//
// x86-64 rseq critical sections. Included only by percpu/internal/rseq_cs.hpp,
// which documents the contract and the return values.
//
// Layout shared by every section below (label numbers are local to one asm
// statement; the compiler may copy a statement, the assembler resolves each
// copy's labels to its nearest definitions):
//
//   3:  the descriptor (struct rseq_cs) in section __rseq_cs, 32-byte aligned:
//       version 0, flags 0, start_ip = 1f, post_commit_offset = 2f - 1f,
//       abort_ip = 4f. A pointer to it goes in __rseq_cs_ptr_array, and each
//       jump out of the section before the commit is listed as a pair
//       (start_ip, exit_ip) in __rseq_exit_point_array.
//       Arming: leaq 3b(%rip) then a store to area->rseq_cs (offset 8), the
//       only store percpu makes to the area. It precedes the start label.
//   1:  start_ip. The first check re-reads the index field (cpu_id or mm_cid)
//       and leaves for the abort path if it is not `index`.
//   2:  post-commit: the first byte after the single committing store.
//   4:  abort_ip, in section __rseq_failure, outside [1, 2). The four bytes
//       before it are the signature 0x53053053, as the disp32 of an
//       "ud1 disp32(%rip), %edi" (bytes 0f b9 3d), so the signature decodes as
//       a trapping instruction rather than as garbage. It jumps to the C
//       label `abort`.
//   5:/6:  PERCPU_INJECT_DELAYS only: a countdown in %ecx between start and
//       commit.
//   7:  PERCPU_COMPARE_TWICE only: re-read the index right before the commit;
//       ud2 if it moved (it cannot, unless the section is broken).
//
// Scratch registers are named clobbers (%rax, %rcx) because asm goto with
// outputs is not available on every supported compiler.
#pragma once

// The asm below is laid out by hand, one instruction per line and operands
// grouped as the operand maps list them; clang-format leaves it alone.
// clang-format off

#if !defined(PERCPU_INTERNAL_RSEQ_CS_DISPATCH)
#error "include percpu/internal/rseq_cs.hpp, not this arch file"
#endif

#include <cstdint>

namespace percpu {
namespace internal {

// rseq_cmpeqv_storev: compare-and-store.
//
//   pseudo-code:   if (area->index != index) return -1;
//                  if (*v != expect) return 1;
//                  *v = newv;                       <- commit
//                  return 0;
//   operands:      area -> %[area], v -> %[v], expect -> %[expect],
//                  newv -> %[newv], index -> %[index], %rax descriptor address
//   labels:        start 1, commit "movq %[newv], (%[v])", post-commit 2,
//                  abort 4 -> C label abort (-1), exit cmpfail (1)
template <index_kind K>
inline int rseq_cmpeqv_storev(rseq_area* area, std::intptr_t* v, std::intptr_t expect,
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
      : [area] "r"(area), [v] "r"(v), [expect] "r"(expect), [newv] "r"(newv),
        [index] "r"(index), [cs_offset] "i"(kRseqCsOffset),
        [index_offset] "i"(index_offset<K>())
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

// rseq_addv: add.
//
//   pseudo-code:   if (area->index != index) return -1;
//                  *v += count;                     <- commit (one RMW instruction,
//                  return 0;                           not locked: only this CPU writes)
//   operands:      area -> %[area], v -> %[v], count -> %[count] (a register or
//                  a sign-extended 32-bit immediate: a constant delta such as
//                  increment()'s needs no register), index -> %[index],
//                  %rax descriptor address
//   labels:        start 1, commit "addq %[count], (%[v])", post-commit 2,
//                  abort 4 -> C label abort (-1); no compare, never returns 1
template <index_kind K>
inline int rseq_addv(rseq_area* area, std::intptr_t* v, std::intptr_t count, int index) noexcept {
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
      ".popsection\n\t"
      "leaq 3b(%%rip), %%rax\n\t"
      "movq %%rax, %c[cs_offset](%[area])\n\t"
      "1:\n\t"
      "cmpl %[index], %c[index_offset](%[area])\n\t"
      "jne %l[abort]\n\t"
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
      "addq %[count], (%[v])\n\t"
      "2:\n\t"
      ".pushsection __rseq_failure, \"ax?\"\n\t"
      ".byte 0x0f, 0xb9, 0x3d\n\t"
      ".long " PERCPU_RSEQ_SIG_STRING "\n\t"
      "4:\n\t"
      "jmp %l[abort]\n\t"
      ".popsection\n\t"
      :
      : [area] "r"(area), [v] "r"(v), [count] "er"(count), [index] "r"(index),
        [cs_offset] "i"(kRseqCsOffset), [index_offset] "i"(index_offset<K>())
#if defined(PERCPU_INJECT_DELAYS)
        , [delay] "r"(inject_delay_loops())
#endif
      : "memory", "cc", "rax", "rcx"
      : abort);
  return 0;
abort:
  return -1;
}

// ---- Started sections (the hot paths' form, see rseq_cs.hpp) ------------
//
// The area is reached %fs-relative, through its offset: no thread pointer
// in a register, and the current thread's area at every instruction, so a
// coroutine resumed on another thread arms that thread's area.

// The sections' area as an offset from the thread pointer, and the CPU its
// cpu_id_start shows, 16 bits zero-extended. Two words, so that it travels
// in registers.
struct section_start {
  std::intptr_t area;
  std::uint64_t cpu;
};

// movzwl: the load itself leaves nothing to test (see rseq_cs.hpp).
inline section_start start_section() noexcept {
  const std::intptr_t area = __atomic_load_n(&g_fast_path.sections_area, __ATOMIC_RELAXED);
  std::uint64_t cpu;
  asm volatile("movzwl %%fs:%c[at](%[area]), %k[cpu]"
               : [cpu] "=r"(cpu)
               : [area] "r"(area), [at] "i"(kCpuIdStartOffset));
  return {area, cpu};
}

// The started area's cpu_id, read as the section reads it (fs-relative, from
// the line start_section() read): -1 or -2 while the thread has no
// registration there.
inline std::int32_t started_area_cpu_id(section_start start) noexcept {
  std::int32_t id;
  asm volatile("movl %%fs:%c[at](%[area]), %[id]"
               : [id] "=r"(id)
               : [area] "r"(start.area), [at] "i"(kCpuIdOffset));
  return id;
}

// The started CPU's copy offset in the stride arena. A shift of a copy: the
// copy is a register rename, where a multiply by the stride (which keeps the
// CPU without one) puts three cycles between the CPU's load and the head's
// address on every pop and push.
inline std::uint64_t started_copy_offset(section_start start) noexcept {
  return start.cpu << kStrideShift;
}

// rseq_addv_started: add, in a started section.
//
//   pseudo-code:   if (area->cpu_id != start.cpu) return -1;
//                  *v += count;                     <- commit (one RMW instruction,
//                  return 0;                           not locked: only this CPU writes)
//   operands:      start.area -> %[area] (an offset: every area access is
//                  %fs-relative), v -> %[v] (a memory operand, so the copy's
//                  address folds into the instruction), count -> %[count],
//                  start.cpu -> %k[cpu], %rax descriptor address
//   labels:        start 1, commit "addq %[count], %[v]", post-commit 2,
//                  abort 4 -> C label abort (-1)
inline int rseq_addv_started(section_start start, std::intptr_t* v,
                             std::intptr_t count) noexcept {
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
      ".popsection\n\t"
      "leaq 3b(%%rip), %%rax\n\t"
      "movq %%rax, %%fs:%c[cs_offset](%[area])\n\t"
      "1:\n\t"
      "cmpl %k[cpu], %%fs:%c[index_offset](%[area])\n\t"
      "jne %l[abort]\n\t"
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
      "cmpl %k[cpu], %%fs:%c[index_offset](%[area])\n\t"
      "je 7f\n\t"
      "ud2\n\t"
      "7:\n\t"
#endif
      "addq %[count], %[v]\n\t"
      "2:\n\t"
      ".pushsection __rseq_failure, \"ax?\"\n\t"
      ".byte 0x0f, 0xb9, 0x3d\n\t"
      ".long " PERCPU_RSEQ_SIG_STRING "\n\t"
      "4:\n\t"
      "jmp %l[abort]\n\t"
      ".popsection\n\t"
      :
      : [area] "r"(start.area), [v] "m"(*v), [count] "er"(count), [cpu] "r"(start.cpu),
        [cs_offset] "i"(kRseqCsOffset), [index_offset] "i"(kCpuIdOffset)
#if defined(PERCPU_INJECT_DELAYS)
        , [delay] "r"(inject_delay_loops())
#endif
      : "memory", "cc", "rax", "rcx"
      : abort);
  return 0;
abort:
  return -1;
}

// rseq_cmpeqv_storev_started: compare-and-store (rseq_cmpeqv_storev), in a
// started section.
//
//   pseudo-code:   if (area->cpu_id != start.cpu) return -1;
//                  if (*v != expect) return 1;
//                  *v = newv;                       <- commit
//                  return 0;
//   operands:      start.area -> %[area] (an offset: %fs-relative), v ->
//                  %[v] (a memory operand), expect -> %[expect], newv ->
//                  %[newv], start.cpu -> %k[cpu], %rax descriptor address
//   labels:        start 1, commit "movq %[newv], %[v]", post-commit 2,
//                  abort 4 -> C label abort (-1), exit cmpfail (1)
inline int rseq_cmpeqv_storev_started(section_start start, std::intptr_t* v,
                                      std::intptr_t expect, std::intptr_t newv) noexcept {
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
      "movq %%rax, %%fs:%c[cs_offset](%[area])\n\t"
      "1:\n\t"
      "cmpl %k[cpu], %%fs:%c[index_offset](%[area])\n\t"
      "jne %l[abort]\n\t"
      "cmpq %[expect], %[v]\n\t"
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
      "cmpl %k[cpu], %%fs:%c[index_offset](%[area])\n\t"
      "je 7f\n\t"
      "ud2\n\t"
      "7:\n\t"
#endif
      "movq %[newv], %[v]\n\t"
      "2:\n\t"
      ".pushsection __rseq_failure, \"ax?\"\n\t"
      ".byte 0x0f, 0xb9, 0x3d\n\t"
      ".long " PERCPU_RSEQ_SIG_STRING "\n\t"
      "4:\n\t"
      "jmp %l[abort]\n\t"
      ".popsection\n\t"
      :
      : [area] "r"(start.area), [v] "m"(*v), [expect] "r"(expect), [newv] "r"(newv),
        [cpu] "r"(start.cpu), [cs_offset] "i"(kRseqCsOffset), [index_offset] "i"(kCpuIdOffset)
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

// rseq_cmpabovev_storeoffp_load_started: the list pop
// (rseq_cmpabovev_storeoffp_load), in a started section.
//
//   pseudo-code:   if (area->cpu_id != start.cpu) return -1;
//                  head = *v;
//                  if ((uintptr_t)head <= floor) return 1;  (empty, or a marker)
//                  *v = *(intptr_t*)(head + voffp);     <- commit
//                  *load = head;                        (after the section)
//                  return 0;
//   operands:      start.area -> %[area] (an offset: %fs-relative), v ->
//                  %[v] (a memory operand: the copy's address folds into
//                  the instruction), floor -> %[floor], voffp -> %[voffp],
//                  start.cpu -> %k[cpu]; outputs head -> %[head] and the
//                  result -> %k[rc]; %rax descriptor address then head's
//                  successor
//   labels:        start 1, commit "movq %%rax, %[v]", post-commit 2,
//                  abort 4 -> end 9 with %k[rc] -1; exits to 9 with %k[rc]
//                  already -1 (another CPU) or 1 (cmpfail)
//
// Unlike the other sections this one is a plain asm with outputs, not an
// asm goto: the popped node leaves in a register, where a store inside the
// section and a load after it would put a store-to-load forwarding on the
// pop-then-push chain of every caller (asm goto with outputs is missing from
// older compilers). So each exit sets %k[rc] before it leaves, the abort
// handler sets it too, and all of them meet at 9 after the post-commit label.
inline int rseq_cmpabovev_storeoffp_load_started(section_start start, std::intptr_t* v,
                                                 std::uintptr_t floor, long voffp,
                                                 std::intptr_t* load) noexcept {
  std::intptr_t head;
  int rc;
  asm volatile(
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
      ".quad 1f, 9f\n\t"
      ".popsection\n\t"
      "leaq 3b(%%rip), %%rax\n\t"
      "movq %%rax, %%fs:%c[cs_offset](%[area])\n\t"
      "1:\n\t"
      "movl $-1, %k[rc]\n\t"
      "cmpl %k[cpu], %%fs:%c[index_offset](%[area])\n\t"
      "jne 9f\n\t"
      "movl $1, %k[rc]\n\t"
      "movq %[v], %[head]\n\t"
      "cmpq %[floor], %[head]\n\t"
      "jbe 9f\n\t"
      "movq (%[head], %[voffp]), %%rax\n\t"
      "xorl %k[rc], %k[rc]\n\t"
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
      "cmpl %k[cpu], %%fs:%c[index_offset](%[area])\n\t"
      "je 7f\n\t"
      "ud2\n\t"
      "7:\n\t"
#endif
      "movq %%rax, %[v]\n\t"
      "2:\n\t"
      ".pushsection __rseq_failure, \"ax?\"\n\t"
      ".byte 0x0f, 0xb9, 0x3d\n\t"
      ".long " PERCPU_RSEQ_SIG_STRING "\n\t"
      "4:\n\t"
      "movl $-1, %k[rc]\n\t"
      "jmp 9f\n\t"
      ".popsection\n\t"
      "9:\n\t"
      : [head] "=&r"(head), [rc] "=&r"(rc)
      : [area] "r"(start.area), [v] "m"(*v), [floor] "er"(floor), [voffp] "r"(voffp),
        [cpu] "r"(start.cpu), [cs_offset] "i"(kRseqCsOffset), [index_offset] "i"(kCpuIdOffset)
#if defined(PERCPU_INJECT_DELAYS)
        , [delay] "r"(inject_delay_loops())
#endif
      : "memory", "cc", "rax", "rcx");
  *load = head;
  return rc;
}

// rseq_cmpnev_trystorev_storev_started: the list push
// (rseq_cmpnev_trystorev_storev), in a started section.
//
//   pseudo-code:   if (area->cpu_id != start.cpu) return -1;
//                  head = *v;
//                  if (head == expectnot) return 1;     (a locked slot)
//                  *v2 = head;                          <- speculative (the caller's node)
//                  *v = newv;                           <- commit
//                  return 0;
//   operands:      start.area -> %[area] (an offset: %fs-relative), v ->
//                  %[v] (a memory operand), expectnot -> %[expectnot], v2
//                  -> %[v2], newv -> %[newv], start.cpu -> %k[cpu], %rax
//                  descriptor address then head
//   labels:        start 1, commit "movq %[newv], %[v]", post-commit 2,
//                  abort 4 -> C label abort (-1), exit cmpfail (1)
inline int rseq_cmpnev_trystorev_storev_started(section_start start, std::intptr_t* v,
                                                std::intptr_t expectnot, std::intptr_t* v2,
                                                std::intptr_t newv) noexcept {
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
      "movq %%rax, %%fs:%c[cs_offset](%[area])\n\t"
      "1:\n\t"
      "cmpl %k[cpu], %%fs:%c[index_offset](%[area])\n\t"
      "jne %l[abort]\n\t"
      "movq %[v], %%rax\n\t"
      "cmpq %[expectnot], %%rax\n\t"
      "je %l[cmpfail]\n\t"
      "movq %%rax, (%[v2])\n\t"
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
      "cmpl %k[cpu], %%fs:%c[index_offset](%[area])\n\t"
      "je 7f\n\t"
      "ud2\n\t"
      "7:\n\t"
#endif
      "movq %[newv], %[v]\n\t"
      "2:\n\t"
      ".pushsection __rseq_failure, \"ax?\"\n\t"
      ".byte 0x0f, 0xb9, 0x3d\n\t"
      ".long " PERCPU_RSEQ_SIG_STRING "\n\t"
      "4:\n\t"
      "jmp %l[abort]\n\t"
      ".popsection\n\t"
      :
      : [area] "r"(start.area), [v] "m"(*v), [expectnot] "er"(expectnot), [v2] "r"(v2),
        [newv] "r"(newv), [cpu] "r"(start.cpu), [cs_offset] "i"(kRseqCsOffset),
        [index_offset] "i"(kCpuIdOffset)
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

// ---- Started by concurrency id (cid_counter, see rseq_cs.hpp) -----------
//
// mm_cid has no start field that the kernel keeps in range, so this section
// reads the concurrency id itself, after arming: from then on a preemption,
// migration or signal aborts it, so the id it read is the thread's until
// the commit. It tests the area's cpu_id for a registration (an
// unregistered area holds -1 or -2, and its mm_cid reads 0, which must not
// commit), and the id against the concurrency limit before it makes the
// copy's address, leaving for the caller's slow path when the id is not
// below it.

// The sections' area and the concurrency id's word (the one
// g_fast_path.concurrency_id names: the area's mm_cid, or its cpu_id where
// the kernel keeps no mm_cid), both as offsets from the thread pointer.
struct cid_start {
  std::intptr_t area;
  std::intptr_t cid_at;
};

inline cid_start start_cid_section() noexcept {
  return {__atomic_load_n(&g_fast_path.sections_area, __ATOMIC_RELAXED),
          __atomic_load_n(&g_fast_path.concurrency_id, __ATOMIC_RELAXED)};
}

// The concurrency id the started word shows now (a slow path's hint; the
// section reads its own): -1 or -2 where it is an unregistered area's cpu_id.
inline std::int32_t started_concurrency_id(cid_start start) noexcept {
  std::int32_t id;
  asm volatile("movl %%fs:(%[at]), %[id]" : [id] "=r"(id) : [at] "r"(start.cid_at));
  return id;
}

// rseq_addv_cid_started: add, at the copy of the thread's concurrency id.
//
//   pseudo-code:   if (area->cpu_id < 0) return -1;
//                  id = *cid_at;
//                  if (id >= limit) return 1;
//                  *(intptr_t*)((char*)base + (id << kStrideShift)) += count;  <- commit
//                  return 0;                        (one RMW instruction, not
//                                                   locked: only this id writes)
//   operands:      start.area -> %[area] and start.cid_at -> %[cid_at]
//                  (offsets: %fs-relative), base -> %[base], limit ->
//                  %k[limit], count -> %[count], %rax the descriptor address,
//                  then the id and its copy's offset
//   labels:        start 1, commit "addq %[count], (%[base],%%rax)",
//                  post-commit 2, abort 4 -> C label abort (-1), exit beyond (1)
inline int rseq_addv_cid_started(cid_start start, std::intptr_t* base, std::uint32_t limit,
                                 std::intptr_t count) noexcept {
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
      ".quad 1f, %l[beyond]\n\t"
      ".popsection\n\t"
      "leaq 3b(%%rip), %%rax\n\t"
      "movq %%rax, %%fs:%c[cs_offset](%[area])\n\t"
      "1:\n\t"
      "cmpl $0, %%fs:%c[cpu_offset](%[area])\n\t"
      "jl %l[abort]\n\t"
      "movl %%fs:(%[cid_at]), %%eax\n\t"
      "cmpl %k[limit], %%eax\n\t"
      "jae %l[beyond]\n\t"
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
      "cmpl %%eax, %%fs:(%[cid_at])\n\t"
      "je 7f\n\t"
      "ud2\n\t"
      "7:\n\t"
#endif
      "shlq %[shift], %%rax\n\t"
      "addq %[count], (%[base],%%rax)\n\t"
      "2:\n\t"
      ".pushsection __rseq_failure, \"ax?\"\n\t"
      ".byte 0x0f, 0xb9, 0x3d\n\t"
      ".long " PERCPU_RSEQ_SIG_STRING "\n\t"
      "4:\n\t"
      "jmp %l[abort]\n\t"
      ".popsection\n\t"
      :
      : [area] "r"(start.area), [cid_at] "r"(start.cid_at), [base] "r"(base),
        [limit] "r"(limit), [count] "er"(count), [cs_offset] "i"(kRseqCsOffset),
        [cpu_offset] "i"(kCpuIdOffset), [shift] "J"(kStrideShift)
#if defined(PERCPU_INJECT_DELAYS)
        , [delay] "r"(inject_delay_loops())
#endif
      : "memory", "cc", "rax", "rcx"
      : abort, beyond);
  return 0;
abort:
  return -1;
beyond:
  return 1;
}

// rseq_cmpeqv_storev_cid_started: compare-and-store, at the copy of the
// thread's concurrency id (per_cpu by concurrency id).
//
//   pseudo-code:   if (area->cpu_id < 0) return -1;
//                  id = *cid_at;
//                  if (id >= limit) return 2;
//                  p = (intptr_t*)((char*)base + (id << kStrideShift));
//                  if (*p != expect) return 1;
//                  *p = newv;                       <- commit
//                  return 0;
//   operands:      start.area -> %[area] and start.cid_at -> %[cid_at]
//                  (offsets: %fs-relative), base -> %[base], limit ->
//                  %k[limit], expect -> %[expect], newv -> %[newv], %rax the
//                  descriptor address, then the id and its copy's offset
//   labels:        start 1, commit "movq %[newv], (%[base],%%rax)",
//                  post-commit 2, abort 4 -> C label abort (-1), exits
//                  cmpfail (1) and beyond (2)
inline int rseq_cmpeqv_storev_cid_started(cid_start start, std::intptr_t* base,
                                          std::uint32_t limit, std::intptr_t expect,
                                          std::intptr_t newv) noexcept {
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
      ".quad 1f, %l[beyond]\n\t"
      ".popsection\n\t"
      "leaq 3b(%%rip), %%rax\n\t"
      "movq %%rax, %%fs:%c[cs_offset](%[area])\n\t"
      "1:\n\t"
      "cmpl $0, %%fs:%c[cpu_offset](%[area])\n\t"
      "jl %l[abort]\n\t"
      "movl %%fs:(%[cid_at]), %%eax\n\t"
      "cmpl %k[limit], %%eax\n\t"
      "jae %l[beyond]\n\t"
      "shlq %[shift], %%rax\n\t"
      "cmpq %[expect], (%[base],%%rax)\n\t"
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
      "movl %%fs:(%[cid_at]), %%ecx\n\t"
      "shlq %[shift], %%rcx\n\t"
      "cmpq %%rcx, %%rax\n\t"
      "je 7f\n\t"
      "ud2\n\t"
      "7:\n\t"
#endif
      "movq %[newv], (%[base],%%rax)\n\t"
      "2:\n\t"
      ".pushsection __rseq_failure, \"ax?\"\n\t"
      ".byte 0x0f, 0xb9, 0x3d\n\t"
      ".long " PERCPU_RSEQ_SIG_STRING "\n\t"
      "4:\n\t"
      "jmp %l[abort]\n\t"
      ".popsection\n\t"
      :
      : [area] "r"(start.area), [cid_at] "r"(start.cid_at), [base] "r"(base),
        [limit] "r"(limit), [expect] "r"(expect), [newv] "r"(newv),
        [cs_offset] "i"(kRseqCsOffset), [cpu_offset] "i"(kCpuIdOffset), [shift] "J"(kStrideShift)
#if defined(PERCPU_INJECT_DELAYS)
        , [delay] "r"(inject_delay_loops())
#endif
      : "memory", "cc", "rax", "rcx"
      : abort, cmpfail, beyond);
  return 0;
abort:
  return -1;
cmpfail:
  return 1;
beyond:
  return 2;
}

// rseq_cmpeqv_trystorev_storev: compare, then a speculative store and the
// committing store (e.g. push: node->next = head speculatively, head = node).
//
//   pseudo-code:   if (area->index != index) return -1;
//                  if (*v != expect) return 1;
//                  *v2 = newv2;                     <- speculative, may survive an abort
//                  *v = newv;                       <- commit
//                  return 0;
//   operands:      area -> %[area], v -> %[v], expect -> %[expect],
//                  v2 -> %[v2], newv2 -> %[newv2], newv -> %[newv],
//                  index -> %[index], %rax descriptor address
//   labels:        start 1, commit "movq %[newv], (%[v])", post-commit 2,
//                  abort 4 -> C label abort (-1), exit cmpfail (1)
template <index_kind K>
inline int rseq_cmpeqv_trystorev_storev(rseq_area* area, std::intptr_t* v, std::intptr_t expect,
                                        std::intptr_t* v2, std::intptr_t newv2,
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
      "movq %[newv2], (%[v2])\n\t"
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
        [newv2] "r"(newv2), [newv] "r"(newv), [index] "r"(index),
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

// rseq_cmpabovev_storeoffp_load: intrusive-list pop. *v is the list head, each
// node keeps its successor at byte offset voffp. Every head value up to
// `floor` (unsigned) is a marker, not a node: percpu's lists end in 0 and a
// locker leaves 1 (kSlotLocked), so one compare sends both to the caller's
// slow path, and a zeroed head (fresh per-CPU memory) is an empty list.
//
//   pseudo-code:   if (area->index != index) return -1;
//                  head = *v;
//                  if ((uintptr_t)head <= floor) return 1;  (empty, or a marker)
//                  *load = head;                        <- speculative
//                  *v = *(intptr_t*)(head + voffp);     <- commit
//                  return 0;
//   operands:      area -> %[area], v -> %[v], floor -> %[floor],
//                  voffp -> %[voffp], load -> %[load], index -> %[index],
//                  %rax descriptor address then head then head's successor
//   labels:        start 1, commit "movq %%rax, (%[v])", post-commit 2,
//                  abort 4 -> C label abort (-1), exit cmpfail (1)
//   Why it is ABA-safe: the head is read and replaced inside one section on
//   the owning CPU, so no other push or pop can run in between.
template <index_kind K>
inline int rseq_cmpabovev_storeoffp_load(rseq_area* area, std::intptr_t* v, std::uintptr_t floor,
                                      long voffp, std::intptr_t* load, int index) noexcept {
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
      "movq (%[v]), %%rax\n\t"
      "cmpq %[floor], %%rax\n\t"
      "jbe %l[cmpfail]\n\t"
      "movq %%rax, (%[load])\n\t"
      "movq (%%rax, %[voffp]), %%rax\n\t"
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
      "movq %%rax, (%[v])\n\t"
      "2:\n\t"
      ".pushsection __rseq_failure, \"ax?\"\n\t"
      ".byte 0x0f, 0xb9, 0x3d\n\t"
      ".long " PERCPU_RSEQ_SIG_STRING "\n\t"
      "4:\n\t"
      "jmp %l[abort]\n\t"
      ".popsection\n\t"
      :
      : [area] "r"(area), [v] "r"(v), [floor] "r"(floor), [voffp] "r"(voffp),
        [load] "r"(load), [index] "r"(index), [cs_offset] "i"(kRseqCsOffset),
        [index_offset] "i"(index_offset<K>())
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

// rseq_cmpnev_trystorev_storev: intrusive-list push. *v is the list head;
// the head read inside the section goes to *v2 (the link of the chain's
// last node) before newv (its first node) commits as the head.
//
//   pseudo-code:   if (area->index != index) return -1;
//                  head = *v;
//                  if (head == expectnot) return 1;     (a locked slot)
//                  *v2 = head;                          <- speculative (the caller's node)
//                  *v = newv;                           <- commit
//                  return 0;
//   operands:      area -> %[area], v -> %[v], expectnot -> %[expectnot],
//                  v2 -> %[v2], newv -> %[newv], index -> %[index],
//                  %rax descriptor address then head
//   labels:        start 1, commit "movq %[newv], (%[v])", post-commit 2,
//                  abort 4 -> C label abort (-1), exit cmpfail (1)
//   Why no expected head: the head is read inside the section, so no copy
//   of it can be stale, and the link written before the commit is in the
//   caller's own node, which nobody reaches before the commit.
template <index_kind K>
inline int rseq_cmpnev_trystorev_storev(rseq_area* area, std::intptr_t* v, std::intptr_t expectnot,
                                        std::intptr_t* v2, std::intptr_t newv, int index) noexcept {
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
      "movq (%[v]), %%rax\n\t"
      "cmpq %[expectnot], %%rax\n\t"
      "je %l[cmpfail]\n\t"
      "movq %%rax, (%[v2])\n\t"
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
      : [area] "r"(area), [v] "r"(v), [expectnot] "r"(expectnot), [v2] "r"(v2),
        [newv] "r"(newv), [index] "r"(index), [cs_offset] "i"(kRseqCsOffset),
        [index_offset] "i"(index_offset<K>())
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

// rseq_cmpeqv_cmpeqv_storev: double compare, one store (the object pool's
// push onto a bounded cache; see rseq_cs.hpp for why it needs both).
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
// clang-format on
