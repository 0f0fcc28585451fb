// Do not include directly; not a stable API (internal to percpu).
//
// Dispatcher: percpu's rseq critical sections, the building blocks of the
// per-CPU structures (counter, free list, object pool).
//
// Exactly one architecture file is included: rseq_cs_x86_64.hpp,
// rseq_cs_aarch64.hpp, or rseq_cs_fallback.hpp where percpu has no rseq (there
// the operations always report an abort, and rseq_area_for_sections() always
// returns nullptr, so callers take their atomic path).
//
// The contract every architecture file implements, in namespace
// percpu::internal (each operation is a function template on index_kind, with
// one explicit definition per arch; `area` is the calling thread's registered
// area from rseq_area_for_sections(), never nullptr):
//
//   template <index_kind K>
//   int rseq_cmpeqv_storev(rseq_area* area, intptr_t* v, intptr_t expect,
//                          intptr_t newv, int index) noexcept;
//       if (*v == expect) *v = newv;                            compare-and-store
//
//   template <index_kind K>
//   int rseq_addv(rseq_area* area, intptr_t* v, intptr_t count, int index) noexcept;
//       *v += count;                                            add
//
//   template <index_kind K>
//   int rseq_cmpeqv_trystorev_storev(rseq_area* area, intptr_t* v, intptr_t expect,
//                                    intptr_t* v2, intptr_t newv2, intptr_t newv,
//                                    int index) noexcept;
//       if (*v == expect) { *v2 = newv2; *v = newv; }           v2 is the speculative
//                                                               store, v the commit
//
//   template <index_kind K>
//   int rseq_cmpabovev_storeoffp_load(rseq_area* area, intptr_t* v, uintptr_t floor,
//                                     long voffp, intptr_t* load, int index) noexcept;
//       if ((uintptr_t)*v > floor) {                           intrusive-list pop:
//         *load = *v;                                           *v is the head, voffp
//         *v = *(intptr_t*)(*v + voffp);                        the offset of "next";
//       }                                                       values up to floor are
//                                                               the empty list (0) and
//                                                               markers, never nodes
//
//   template <index_kind K>
//   int rseq_cmpnev_trystorev_storev(rseq_area* area, intptr_t* v, intptr_t expectnot,
//                                    intptr_t* v2, intptr_t newv, int index) noexcept;
//       if (*v != expectnot) {                                  intrusive-list push of
//         *v2 = *v;                                             a chain: v2 is its last
//         *v = newv;                                            node's link, newv its
//       }                                                       first node
//
//   template <index_kind K>
//   int rseq_cmpeqv_cmpeqv_storev(rseq_area* area, intptr_t* v, intptr_t expect,
//                                 intptr_t* v2, intptr_t expect2, intptr_t newv,
//                                 int index) noexcept;
//       if (*v == expect && *v2 == expect2) *v = newv;          double compare, one store
//
//     Why the object pool needs it: its per-CPU caches are bounded, so every
//     free object on a cache carries its depth. A push reads the head h and
//     h's depth d outside the section, writes depth d + 1 into the new node,
//     and commits only if the head is still h and h's depth is still d.
//     Comparing the head alone would let h leave and come back at another
//     depth in between (ABA on the depth); with both compared, a head that
//     came back at the same depth sits on a list of the same length, so the
//     new depth is exact.
//
// Return value of every operation:
//    0  committed: the last store happened, on the CPU (or mm_cid) `index`.
//    1  the comparison failed: nothing was stored (cmpabovev_storeoffp_load may
//       have written *load; ignore it).
//   -1  aborted (preemption, migration, signal) or `index` is not the
//       thread's current index: the committing store did not happen. The
//       speculative stores (*v2, *load) may have happened. Re-read the index
//       and retry; after a bounded number of tries use the atomic path.
//
// Every section stores its descriptor address in area->rseq_cs (the only
// field of the area percpu writes), then re-checks inside the section that
// the index field of `area` (cpu_id or mm_cid, per K) equals `index`, and
// ends with its single committing store. Calling pattern:
//
//   rseq_area* area = rseq_area_for_sections();
//   if (area == nullptr) -> atomic path
//   for (tries) {
//     int cpu = rseq_current_index<index_kind::cpu_id>(area);
//     if (rseq_addv<index_kind::cpu_id>(area, &slot[cpu], 1, cpu) == 0) done;
//   }
//
// Locality rule: a word updated by these operations must only ever be written
// by sections indexed by the slot it belongs to. A plain store here and an
// atomic read-modify-write from another thread on the same word lose updates.
// Readers on other CPUs may read it with relaxed atomic loads.
//
// The hot paths' form (counter::add, per_cpu<T>::add): a section started
// with no test at all, as a librseq user's does:
//
//   section_start st = start_section();
//   if (rseq_addv_started(st, &stride_copy_at(object, st)->word, count) == 0) done;
//   else -> the slow path
//
//   start_section() reads the offset of the sections' area
//   (g_fast_path.sections_area, cpu.hpp) and that area's cpu_id_start as 16
//   bits, and computes the CPU's copy offset in the stride arena. The
//   section then compares the area's cpu_id with that CPU and commits only
//   if they are equal. Why that is enough:
//     - cpu_id_start needs no test: the kernel keeps it equal to cpu_id
//       while the area is registered; an unregistered area holds cpu_id -1
//       or -2, which no 16-bit value equals, and the sections' area is the
//       unregistered one before start-up, where sections are off and where
//       max_cpus() is not proven to bound every id. Whatever another
//       library may leave in cpu_id_start, a commit happens only on the CPU
//       the kernel wrote in cpu_id, so at that CPU's copy.
//     - the copy's address is computed before the section but first touched
//       by its committing instruction, so an address made from a value the
//       section rejects is never accessed.
//   Only cpu_id indexes these sections; mm_cid has no start field.
//
//   The concurrency-id form (cid_counter::add, cid_per_cpu's add and
//   compare-and-store): start_cid_section() loads
//   the sections' area and the word g_fast_path.concurrency_id names (the
//   area's mm_cid, or its cpu_id where the kernel keeps none, decided once
//   at start-up). rseq_addv_cid_started reads the id from that word inside
//   the section, after arming, so no compare is needed to know it is still
//   the thread's at the commit: mm_cid has no start field kept in range to
//   read before. It tests the area's cpu_id for a registration (an
//   unregistered area's mm_cid reads 0 and must not commit), and the id
//   against the concurrency limit (concurrency_limit.hpp) before it makes
//   the copy's address, leaving with 1 for the caller's slow path when the
//   id is not below it; so every copy it touches exists and readers walk it.
//   rseq_cmpeqv_storev_cid_started is the compare-and-store in the same
//   frame: 1 when the copy holds another value, 2 when the id is not below
//   the limit.
//
//   The lists' hot paths (free_list push and pop, object_pool allocate) are
//   started the same way, with one test before the section, of the started
//   area's cpu_id (started_area_cpu_id(): a thread without a registration
//   there leaves before arming; cpu_slots.hpp says why it is worth its cost):
//   rseq_cmpabovev_storeoffp_load_started and
//   rseq_cmpnev_trystorev_storev_started are the pop and the push above on
//   the started area and CPU. Both read the head inside the section, after
//   the CPU compare, so a head copy's address made from a rejected
//   cpu_id_start is never touched either. What the lists' remote lockers
//   need of a thread before its first section, the section users count
//   (registration.hpp) has from start-up or from the thread's registration
//   (cpu_slots.hpp, "The started form"). On x86-64 the started pop hands the
//   popped node back in a register (see there).
//
//   ref's get and put (ref.hpp) are rseq_cmpeqv_storev_started after the
//   same one test: the word is read before the section, which compares it
//   again, and the test is what makes that early read safe (a registered
//   area's cpu_id_start is a CPU id, so the word exists).
//
// Test seams (compile time):
//   PERCPU_INJECT_DELAYS   a delay loop of g_inject_delay_loops iterations
//                          inside every section, between its start and its
//                          commit, so preemption, migration and signals hit
//                          sections often.
//   PERCPU_COMPARE_TWICE   every section re-reads the index right before its
//                          commit and traps (ud2 / brk) if it changed: a
//                          commit on the wrong CPU kills the process.
//
// Thread safety: each operation acts on the calling thread's area only.
// Async-signal-safe: yes (a signal aborts the interrupted section before the
// handler runs, so the handler may run sections of its own).
#pragma once

#include <atomic>
#include <cstdint>

#include "percpu/cpu.hpp"
#include "percpu/internal/config.hpp"
#include "percpu/internal/registration.hpp"
#include "percpu/internal/rseq_abi.hpp"
#include "percpu/internal/stride_arena.hpp"

namespace percpu {
namespace internal {

// Which field of the rseq area indexes a section, chosen at compile time.
enum class index_kind {
  cpu_id,  // struct rseq cpu_id: the CPU the thread runs on
  mm_cid,  // struct rseq mm_cid: a dense per-process id; needs feature size >= 28
};

// The byte offset, in struct rseq, of the field K names.
template <index_kind K>
constexpr std::ptrdiff_t index_offset() noexcept {
  return K == index_kind::cpu_id ? kCpuIdOffset : kMmCidOffset;
}
static_assert(index_offset<index_kind::cpu_id>() == 4, "rseq ABI: cpu_id");
static_assert(index_offset<index_kind::mm_cid>() == 24, "rseq ABI: mm_cid");
static_assert(kRseqCsOffset == 8, "rseq ABI: rseq_cs");

// How many times every caller of these sections tries before it takes its
// no-rseq path for this call (the counter's atomic word, a list's locked
// path). Aborts (preemption, migration, signals) and compare failures from a
// concurrent section on the same CPU are rare, so the first try almost always
// commits; the bound keeps a thread that keeps being hit from spinning, and
// one bound for every structure keeps them alike under a storm of signals.
constexpr int kSectionTries = 16;

// Iterations of the PERCPU_INJECT_DELAYS loop; tests may change it at any time.
inline std::atomic<unsigned> g_inject_delay_loops{64};

inline unsigned inject_delay_loops() noexcept {
  return g_inject_delay_loops.load(std::memory_order_relaxed);
}

// The calling thread's registered area, or nullptr when it has no rseq or
// sections are off (the caller must then use atomics). Inline fast path: the
// area the sections arm, when it shows an id (sections_area_if_registered());
// anything else asks the slow path, which runs start-up and registers the
// thread first if that is percpu's job.
inline rseq_area* rseq_area_for_sections() noexcept {
  if (rseq_area* area = sections_area_if_registered()) return area;
  return registered_rseq_area();
}

// The current value of the index field K of `area`, read once. Outside a
// section it is only a hint; the section re-checks it.
template <index_kind K>
inline int rseq_current_index(const rseq_area* area) noexcept {
  const char* field = reinterpret_cast<const char*>(area) + index_offset<K>();
  return *reinterpret_cast<volatile const std::int32_t*>(field);
}

// Whether sections indexed by K can run in this process: mm_cid needs a
// kernel that keeps it current (feature size >= 28).
inline bool index_kind_usable(index_kind k) noexcept {
  return k == index_kind::cpu_id || rseq_feature_size() >= kFeatureSizeMmCid;
}

// Every object (program, shared library, plugin) that includes this header
// holds critical sections of its own: the inline operations put their
// descriptors and code in the object that calls them, even when percpu
// itself is a shared library. After a section the thread's rseq_cs keeps
// pointing at the descriptor until the kernel next clears it, so an object
// unloaded then would make the kernel fault on the next preemption or
// signal. This constructor, one per translation unit, keeps the object that
// holds it loaded (pin_object_containing: nothing for the main program,
// cheap once pinned). It touches none of percpu's start-up state, so it may
// run before percpu's constructor.
namespace {
__attribute__((constructor)) void pin_object_with_sections() noexcept {
  static const char anchor = 0;
  pin_object_containing(&anchor);
}
}  // namespace

}  // namespace internal
}  // namespace percpu

#define PERCPU_INTERNAL_RSEQ_CS_DISPATCH 1
#if defined(__x86_64__)
#include "percpu/internal/rseq_cs_x86_64.hpp"
#elif defined(__aarch64__)
#include "percpu/internal/rseq_cs_aarch64.hpp"
#else
#include "percpu/internal/rseq_cs_fallback.hpp"
#endif
#undef PERCPU_INTERNAL_RSEQ_CS_DISPATCH

namespace percpu {
namespace internal {

// The copy of `object` (CPU 0's copy, from the stride arena) that belongs to
// the CPU a started section runs on.
template <typename T>
inline T* stride_copy_at(T* object, section_start start) noexcept {
  return reinterpret_cast<T*>(reinterpret_cast<char*>(object) + started_copy_offset(start));
}

}  // namespace internal
}  // namespace percpu
