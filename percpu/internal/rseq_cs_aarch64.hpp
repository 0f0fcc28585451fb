// Do not include directly; not a stable API (internal to percpu).
//
// aarch64 rseq critical sections. Included only by percpu/internal/rseq_cs.hpp,
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
//       Arming: adrp/add form the descriptor's address in x9, then a store to
//       area->rseq_cs (offset 8), the only store percpu makes to the area. It
//       precedes the start label.
//   1:  start_ip. The first check re-reads the index field (cpu_id or mm_cid)
//       and leaves for the abort path if it is not `index`.
//   2:  post-commit: the first instruction after the single committing store.
//   4:  abort_ip, in section __rseq_failure, outside [1, 2). The instruction
//       before it is the signature 0xd428bc00 (brk #0x45e0), so falling into
//       it traps. It branches to the C label `abort`.
//   5:/6:  PERCPU_INJECT_DELAYS only: a countdown in w11 between start and
//       commit.
//   7:  PERCPU_COMPARE_TWICE only: re-read the index right before the commit;
//       brk if it moved (it cannot, unless the section is broken).
//
// Stores are plain str: the section runs on one CPU and that CPU observes its
// own stores in order, and the kernel's abort is a context switch, which
// orders everything. No barrier or acquire/release is needed inside.
// Scratch registers are named clobbers (x9, x10, x11; never x16/x17, which a
// linker veneer may use) because asm goto with outputs is not available on
// every supported compiler.
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
//                  newv -> %[newv], index -> %w[index], x9 descriptor address,
//                  w10/x10 loaded values
//   labels:        start 1, commit "str %[newv], [%[v]]", post-commit 2,
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
      : [area] "r"(area), [v] "r"(v), [expect] "r"(expect), [newv] "r"(newv),
        [index] "r"(index), [cs_offset] "i"(kRseqCsOffset),
        [index_offset] "i"(index_offset<K>())
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

// rseq_addv: add.
//
//   pseudo-code:   if (area->index != index) return -1;
//                  tmp = *v + count;
//                  *v = tmp;                        <- commit
//                  return 0;
//   operands:      area -> %[area], v -> %[v], count -> %[count],
//                  index -> %w[index], x9 descriptor address, x10 the sum
//   labels:        start 1, commit "str x10, [%[v]]", post-commit 2,
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
      "adrp x9, 3b\n\t"
      "add x9, x9, :lo12:3b\n\t"
      "str x9, [%[area], %c[cs_offset]]\n\t"
      "1:\n\t"
      "ldr w10, [%[area], %c[index_offset]]\n\t"
      "cmp w10, %w[index]\n\t"
      "b.ne %l[abort]\n\t"
      "ldr x10, [%[v]]\n\t"
      "add x10, x10, %[count]\n\t"
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
      "str x10, [%[v]]\n\t"
      "2:\n\t"
      ".pushsection __rseq_failure, \"ax?\"\n\t"
      ".inst " PERCPU_RSEQ_SIG_STRING "\n\t"
      "4:\n\t"
      "b %l[abort]\n\t"
      ".popsection\n\t"
      :
      : [area] "r"(area), [v] "r"(v), [count] "r"(count), [index] "r"(index),
        [cs_offset] "i"(kRseqCsOffset), [index_offset] "i"(index_offset<K>())
#if defined(PERCPU_INJECT_DELAYS)
        , [delay] "r"(inject_delay_loops())
#endif
      : "memory", "cc", "x9", "x10", "x11"
      : abort);
  return 0;
abort:
  return -1;
}

// ---- Started sections (the hot paths' form, see rseq_cs.hpp) ------------

// The sections' area (the thread pointer read afresh, plus its offset), and
// the CPU its cpu_id_start shows, 16 bits zero-extended.
struct section_start {
  rseq_area* area;
  std::uint64_t cpu;
};

// ldrh: the load itself leaves nothing to test (see rseq_cs.hpp).
inline section_start start_section() noexcept {
  auto* area = reinterpret_cast<rseq_area*>(
      thread_pointer() + __atomic_load_n(&g_fast_path.sections_area, __ATOMIC_RELAXED));
  std::uint64_t cpu;  // ldrh clears the upper bits: no zero extension after it
  asm volatile("ldrh %w[cpu], [%[area], %c[at]]"
               : [cpu] "=r"(cpu)
               : [area] "r"(area), [at] "i"(kCpuIdStartOffset));
  return {area, cpu};
}

// The started area's cpu_id, read as the section reads it: -1 or -2 while
// the thread has no registration there.
inline std::int32_t started_area_cpu_id(section_start start) noexcept {
  return *reinterpret_cast<volatile const std::int32_t*>(&start.area->cpu_id);
}

// The started CPU's copy offset in the stride arena (the shift folds into
// the address computation, add x, x, x, lsl #16).
inline std::uint64_t started_copy_offset(section_start start) noexcept {
  return start.cpu << kStrideShift;
}

// rseq_addv_started: rseq_addv above, on the started section's area and CPU.
inline int rseq_addv_started(section_start start, std::intptr_t* v,
                             std::intptr_t count) noexcept {
  return rseq_addv<index_kind::cpu_id>(start.area, v, count, static_cast<int>(start.cpu));
}

// rseq_cmpeqv_storev_started: rseq_cmpeqv_storev above, on the started
// section's area and CPU.
inline int rseq_cmpeqv_storev_started(section_start start, std::intptr_t* v,
                                      std::intptr_t expect, std::intptr_t newv) noexcept {
  return rseq_cmpeqv_storev<index_kind::cpu_id>(start.area, v, expect, newv,
                                                static_cast<int>(start.cpu));
}

// The list pop and push (rseq_cmpabovev_storeoffp_load and
// rseq_cmpnev_trystorev_storev, below), on the started section's area and
// CPU.
template <index_kind K>
inline int rseq_cmpabovev_storeoffp_load(rseq_area* area, std::intptr_t* v, std::uintptr_t floor,
                                         long voffp, std::intptr_t* load, int index) noexcept;
template <index_kind K>
inline int rseq_cmpnev_trystorev_storev(rseq_area* area, std::intptr_t* v, std::intptr_t expectnot,
                                        std::intptr_t* v2, std::intptr_t newv, int index) noexcept;
inline int rseq_cmpabovev_storeoffp_load_started(section_start start, std::intptr_t* v,
                                                 std::uintptr_t floor, long voffp,
                                                 std::intptr_t* load) noexcept {
  return rseq_cmpabovev_storeoffp_load<index_kind::cpu_id>(start.area, v, floor, voffp, load,
                                                           static_cast<int>(start.cpu));
}
inline int rseq_cmpnev_trystorev_storev_started(section_start start, std::intptr_t* v,
                                                std::intptr_t expectnot, std::intptr_t* v2,
                                                std::intptr_t newv) noexcept {
  return rseq_cmpnev_trystorev_storev<index_kind::cpu_id>(start.area, v, expectnot, v2, newv,
                                                          static_cast<int>(start.cpu));
}

// ---- Started by concurrency id (cid_counter, see rseq_cs.hpp) -----------
//
// As on x86-64: the section reads the concurrency id itself, after arming,
// tests the area's cpu_id for a registration and the id against the
// concurrency limit, and leaves for the caller's slow path when it is not
// below it.

// The sections' area and the concurrency id's word (the one
// g_fast_path.concurrency_id names).
struct cid_start {
  rseq_area* area;
  const std::int32_t* cid_at;
};

inline cid_start start_cid_section() noexcept {
  char* const tp = thread_pointer();
  return {reinterpret_cast<rseq_area*>(tp + __atomic_load_n(&g_fast_path.sections_area,
                                                             __ATOMIC_RELAXED)),
          reinterpret_cast<const std::int32_t*>(
              tp + __atomic_load_n(&g_fast_path.concurrency_id, __ATOMIC_RELAXED))};
}

// The concurrency id the started word shows now (a slow path's hint; the
// section reads its own).
inline std::int32_t started_concurrency_id(cid_start start) noexcept {
  return *reinterpret_cast<volatile const std::int32_t*>(start.cid_at);
}

// rseq_addv_cid_started: add, at the copy of the thread's concurrency id.
//
//   pseudo-code:   if (area->cpu_id < 0) return -1;
//                  id = *cid_at;
//                  if (id >= limit) return 1;
//                  p = (intptr_t*)((char*)base + (id << kStrideShift));
//                  tmp = *p + count;
//                  *p = tmp;                        <- commit
//                  return 0;
//   operands:      start.area -> %[area], start.cid_at -> %[cid_at], base ->
//                  %[base], limit -> %w[limit], count -> %[count], x9 the
//                  descriptor address, then cpu_id and the id (w9), x10 the
//                  copy's address, x11 the sum, w12 the seams' scratch
//   labels:        start 1, commit "str x11, [x10]", post-commit 2,
//                  abort 4 -> C label abort (-1), exit beyond (1)
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
      "adrp x9, 3b\n\t"
      "add x9, x9, :lo12:3b\n\t"
      "str x9, [%[area], %c[cs_offset]]\n\t"
      "1:\n\t"
      "ldr w9, [%[area], %c[cpu_offset]]\n\t"
      "tbnz w9, #31, %l[abort]\n\t"
      "ldr w9, [%[cid_at]]\n\t"
      "cmp w9, %w[limit]\n\t"
      "b.hs %l[beyond]\n\t"
      "add x10, %[base], x9, lsl %c[shift]\n\t"
      "ldr x11, [x10]\n\t"
      "add x11, x11, %[count]\n\t"
#if defined(PERCPU_INJECT_DELAYS)
      "mov w12, %w[delay]\n\t"
      "5:\n\t"
      "cbz w12, 6f\n\t"
      "sub w12, w12, #1\n\t"
      "b 5b\n\t"
      "6:\n\t"
#endif
#if defined(PERCPU_COMPARE_TWICE)
      "ldr w12, [%[cid_at]]\n\t"
      "cmp w12, w9\n\t"
      "b.eq 7f\n\t"
      "brk #0x7\n\t"
      "7:\n\t"
#endif
      "str x11, [x10]\n\t"
      "2:\n\t"
      ".pushsection __rseq_failure, \"ax?\"\n\t"
      ".inst " PERCPU_RSEQ_SIG_STRING "\n\t"
      "4:\n\t"
      "b %l[abort]\n\t"
      ".popsection\n\t"
      :
      : [area] "r"(start.area), [cid_at] "r"(start.cid_at), [base] "r"(base),
        [limit] "r"(limit), [count] "r"(count), [cs_offset] "i"(kRseqCsOffset),
        [cpu_offset] "i"(kCpuIdOffset), [shift] "i"(kStrideShift)
#if defined(PERCPU_INJECT_DELAYS)
        , [delay] "r"(inject_delay_loops())
#endif
      : "memory", "cc", "x9", "x10", "x11", "x12"
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
//   operands:      start.area -> %[area], start.cid_at -> %[cid_at], base ->
//                  %[base], limit -> %w[limit], expect -> %[expect], newv ->
//                  %[newv], x9 the descriptor address, then cpu_id and the
//                  id (w9), x10 the copy's address, x11 its value, w12 the
//                  seams' scratch
//   labels:        start 1, commit "str %[newv], [x10]", post-commit 2,
//                  abort 4 -> C label abort (-1), exits cmpfail (1) and
//                  beyond (2)
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
      "adrp x9, 3b\n\t"
      "add x9, x9, :lo12:3b\n\t"
      "str x9, [%[area], %c[cs_offset]]\n\t"
      "1:\n\t"
      "ldr w9, [%[area], %c[cpu_offset]]\n\t"
      "tbnz w9, #31, %l[abort]\n\t"
      "ldr w9, [%[cid_at]]\n\t"
      "cmp w9, %w[limit]\n\t"
      "b.hs %l[beyond]\n\t"
      "add x10, %[base], x9, lsl %c[shift]\n\t"
      "ldr x11, [x10]\n\t"
      "cmp x11, %[expect]\n\t"
      "b.ne %l[cmpfail]\n\t"
#if defined(PERCPU_INJECT_DELAYS)
      "mov w12, %w[delay]\n\t"
      "5:\n\t"
      "cbz w12, 6f\n\t"
      "sub w12, w12, #1\n\t"
      "b 5b\n\t"
      "6:\n\t"
#endif
#if defined(PERCPU_COMPARE_TWICE)
      "ldr w12, [%[cid_at]]\n\t"
      "cmp w12, w9\n\t"
      "b.eq 7f\n\t"
      "brk #0x7\n\t"
      "7:\n\t"
#endif
      "str %[newv], [x10]\n\t"
      "2:\n\t"
      ".pushsection __rseq_failure, \"ax?\"\n\t"
      ".inst " PERCPU_RSEQ_SIG_STRING "\n\t"
      "4:\n\t"
      "b %l[abort]\n\t"
      ".popsection\n\t"
      :
      : [area] "r"(start.area), [cid_at] "r"(start.cid_at), [base] "r"(base),
        [limit] "r"(limit), [expect] "r"(expect), [newv] "r"(newv),
        [cs_offset] "i"(kRseqCsOffset), [cpu_offset] "i"(kCpuIdOffset), [shift] "i"(kStrideShift)
#if defined(PERCPU_INJECT_DELAYS)
        , [delay] "r"(inject_delay_loops())
#endif
      : "memory", "cc", "x9", "x10", "x11", "x12"
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
//                  index -> %w[index], x9 descriptor address, w10/x10 loaded values
//   labels:        start 1, commit "str %[newv], [%[v]]", post-commit 2,
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
      "str %[newv2], [%[v2]]\n\t"
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
        [newv2] "r"(newv2), [newv] "r"(newv), [index] "r"(index),
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
//                  voffp -> %[voffp], load -> %[load], index -> %w[index],
//                  x9 descriptor address then head's successor, x10 head
//   labels:        start 1, commit "str x9, [%[v]]", post-commit 2,
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
      "adrp x9, 3b\n\t"
      "add x9, x9, :lo12:3b\n\t"
      "str x9, [%[area], %c[cs_offset]]\n\t"
      "1:\n\t"
      "ldr w10, [%[area], %c[index_offset]]\n\t"
      "cmp w10, %w[index]\n\t"
      "b.ne %l[abort]\n\t"
      "ldr x10, [%[v]]\n\t"
      "cmp x10, %[floor]\n\t"
      "b.ls %l[cmpfail]\n\t"
      "str x10, [%[load]]\n\t"
      "ldr x9, [x10, %[voffp]]\n\t"
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
      "str x9, [%[v]]\n\t"
      "2:\n\t"
      ".pushsection __rseq_failure, \"ax?\"\n\t"
      ".inst " PERCPU_RSEQ_SIG_STRING "\n\t"
      "4:\n\t"
      "b %l[abort]\n\t"
      ".popsection\n\t"
      :
      : [area] "r"(area), [v] "r"(v), [floor] "r"(floor), [voffp] "r"(voffp),
        [load] "r"(load), [index] "r"(index), [cs_offset] "i"(kRseqCsOffset),
        [index_offset] "i"(index_offset<K>())
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
//                  v2 -> %[v2], newv -> %[newv], index -> %w[index],
//                  x9 descriptor address, x10 head
//   labels:        start 1, commit "str %[newv], [%[v]]", post-commit 2,
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
      "adrp x9, 3b\n\t"
      "add x9, x9, :lo12:3b\n\t"
      "str x9, [%[area], %c[cs_offset]]\n\t"
      "1:\n\t"
      "ldr w10, [%[area], %c[index_offset]]\n\t"
      "cmp w10, %w[index]\n\t"
      "b.ne %l[abort]\n\t"
      "ldr x10, [%[v]]\n\t"
      "cmp x10, %[expectnot]\n\t"
      "b.eq %l[cmpfail]\n\t"
      "str x10, [%[v2]]\n\t"
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
      : [area] "r"(area), [v] "r"(v), [expectnot] "r"(expectnot), [v2] "r"(v2),
        [newv] "r"(newv), [index] "r"(index), [cs_offset] "i"(kRseqCsOffset),
        [index_offset] "i"(index_offset<K>())
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
// clang-format on
