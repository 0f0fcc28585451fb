// percpu/per_cpu.hpp: per-CPU copies of a struct of your own, updated with
// no atomic instruction, like the kernel's alloc_percpu() and this_cpu_*().
//
// What it is for
//   Statistics and state that many threads update and few read: request
//   counts, bytes, histograms' buckets, a per-CPU "last seen" value. Every
//   possible CPU has its own copy of your T; an update changes one word of
//   the copy of the CPU the thread runs on, in an rseq critical section
//   that the kernel restarts if the thread is preempted, migrated or
//   signalled, so no update is lost and none needs a lock or an atomic.
//   Readers look at any CPU's copy, or sum a field over all of them.
//
//     struct stats { std::int64_t requests, bytes, errors; };
//     percpu::per_cpu<stats> s;                   // constant-initialised
//     s.add(&stats::requests, 1);                 // this CPU's copy
//     s.add(&stats::bytes, n);
//     std::int64_t total = s.sum(&stats::bytes);  // every copy
//
// When not to use it
//   For one number, percpu::counter is the same thing, ready-made. When
//   several fields must change together as one (a pair that readers must
//   never see half-updated): each operation changes one word, and a reader
//   may see the first add of a pair and not the second. When reads are as
//   frequent as writes: sum() reads every possible CPU's copy (a
//   cid_per_cpu's, those of the concurrency ids used so far; see below).
//
// The operations
//   Each names a field by a pointer to member (`&stats::bytes`) whose type
//   is an 8-byte integer (std::int64_t, std::uint64_t, std::intptr_t, ...):
//   add(field, delta)                  field += delta on this CPU's copy
//   compare_and_store(field, e, d)     if field == e, field = d, on this
//                                      CPU's copy; true if it stored
//   store(field, v)                    field = v on this CPU's copy
//   load(field)                        field of this CPU's copy (the thread
//                                      may move right after: a hint)
//   copy(cpu), atomic_copy(cpu)        a snapshot of CPU `cpu`'s copy, of
//                                      each set (see Without rseq)
//   shared_copy()                      a snapshot of the copy used when no
//                                      memory can be mapped
//   sum(field)                         field summed over every copy
//   cpus()                             how many per-CPU copies: max_cpus()
//   Each update is one critical section ending in its one store: it
//   happens whole on one CPU's copy, or not at all and is retried.
//
// What is atomic with respect to what
//   Each update is atomic with respect to every other update of the same
//   word (one CPU's copy of the field, in one set), on any thread and in
//   signal handlers. Updates of different
//   fields are independent. copy() and shared_copy() read the copy one
//   word at a time: each word is a value some update left, but two words
//   may come from before and after another thread's update. sum() adds the
//   copies one after another while updates go on (as counter::load()):
//   exact once the updates have stopped.
//
// Without rseq
//   A thread whose rseq area the kernel does not keep (no rseq in the
//   kernel, under valgrind or qemu-user, a seccomp filter, another library
//   registered with another signature; see percpu::sections_status()), and
//   a section that kept aborting, update a second set of per-CPU copies with
//   atomic read-modify-writes instead: atomic_copy(cpu), the copy of the CPU
//   the thread runs on (or ran on lately: its answer is cached where asking
//   costs a system call). Sections never write those, so the two kinds of
//   update cannot undo each other, and a process without rseq still
//   updates per-CPU lines. The set is taken when such an update first
//   happens; a process where every thread runs sections never pays for it.
//   A thread's load(), store() and compare_and_store() act on the copy its
//   updates go to: with rseq, copy(its CPU); without, atomic_copy(its CPU).
//   sum() adds every copy of both sets. If no memory can be mapped, updates
//   go to shared_copy(), one more T inside the object, atomically.
//
// Memory
//   The object holds two pointers and the shared copy: 16 + sizeof(T)
//   bytes, rounded to 8. The per-CPU copies come from percpu's per-CPU
//   memory (internal/stride_arena.hpp) on the first update: sizeof(T)
//   rounded up to a power of two (16 bytes at least, 4096 at most) per CPU
//   that updates it, twice where threads with and without rseq both
//   update it. A CPU's copies of many per_cpu objects share that CPU's
//   pages, copies of two CPUs never share a cache line, and a CPU that
//   never updates costs nothing. Given back for reuse by the destructor.
//   A cid_per_cpu is the same, per concurrency id that updates it.
//
// Indexed by concurrency id: cid_per_cpu<T>
//   percpu::cid_per_cpu<T> is per_cpu<T> with its copies indexed by the
//   thread's concurrency id (concurrency_id(): the kernel's mm_cid, Linux
//   6.3+) instead of its CPU, as cid_counter is counter's (counter.hpp says
//   what the ids are). What that changes:
//     - sum() reads the copies of the ids some structure indexed by
//       concurrency id has used so far (internal/concurrency_limit.hpp), not
//       max_cpus() copies: on a host whose possible list is 0-4095, a
//       2-thread process reads about 2 copies of each set instead of 4,096.
//     - copy(i) is what sections made under id i; atomic_copy(i) is still
//       the atomic copy of CPU i, the id threads without rseq have. load(),
//       store() and compare_and_store() act on the copy of the thread's id.
//       cpus() is still max_cpus(), which bounds every id; copies at or
//       above the limit read zero.
//     - add() is one section, as per_cpu's, which also reads the id and the
//       limit and tests one against the other; compare_and_store() runs
//       its section out of line, as per_cpu's does.
//   Where the kernel keeps no mm_cid, the id is the CPU id (decided once at
//   start-up; percpu-bench prints which). The choice is per object, by
//   type, so that neither add pays a test for the other: use cid_per_cpu
//   where a process runs a few threads on a host with many possible CPUs,
//   or sums often, and per_cpu where threads outnumber CPUs.
//
// Thread safety and signals
//   Every member is thread-safe, async-signal-safe and never blocks: the
//   first update takes its memory without malloc and without a lock.
//   Constant-initialised: a global per_cpu works from any constructor and
//   any signal handler. Destroying it while another thread updates it is
//   undefined, as for any object; the destructor leaves it as a fresh one.
//   No member changes errno or is a cancellation point. An update that a
//   signal handler leaves with siglongjmp either happened or did not.
//   All of this holds for cid_per_cpu as well.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <type_traits>

#include "percpu/cpu.hpp"
#include "percpu/internal/concurrency_limit.hpp"
#include "percpu/internal/rseq_cs.hpp"
#include "percpu/internal/stride_arena.hpp"

#pragma GCC visibility push(default)  // exported (see percpu/cpu.hpp)
namespace percpu {
namespace internal {

// M itself, in a context that does not deduce M: the field alone says the
// type, so add(&stats::requests, 1) converts the 1 (std::type_identity_t,
// which C++17 lacks).
template <typename M>
struct same_as {
  using type = M;
};
template <typename M>
using same_as_t = typename same_as<M>::type;

// The arena size class for `bytes` of copy: a power of two, 16 to 4096.
constexpr std::size_t per_cpu_copy_bytes(std::size_t bytes) noexcept {
  std::size_t size = 16;
  while (size < bytes) size *= 2;
  return size;
}

// Where a per_cpu<T> keeps its copies: CPU 0's copy of each set, or
// nullptr until an update needs that set. Sections on CPU c write only
// `copies`' copy c; threads without sections write only `atomic_copies`,
// with atomic read-modify-writes, so neither can undo the other's update.
struct per_cpu_storage {
  std::atomic<void*> copies{nullptr};
  std::atomic<void*> atomic_copies{nullptr};
};

// The out-of-line half of every per_cpu<T>, in the library (per_cpu.cpp),
// one for all T: `bytes` is the copies' size class, `shared` the object's
// shared copy (used when no memory can be mapped) and `offset` the field's
// byte offset in T.
//   per_cpu_add_slow: the first update (which takes the copies), threads
//     without sections, and sections that kept aborting.
PERCPU_EXPORT void per_cpu_add_slow(per_cpu_storage* storage, std::size_t bytes,
                                    std::intptr_t* shared, std::size_t offset,
                                    std::intptr_t delta) noexcept;
PERCPU_EXPORT bool per_cpu_compare_and_store(per_cpu_storage* storage, std::size_t bytes,
                                             std::intptr_t* shared, std::size_t offset,
                                             std::intptr_t expected, std::intptr_t desired) noexcept;
PERCPU_EXPORT std::intptr_t per_cpu_load(per_cpu_storage* storage, std::size_t bytes,
                                         std::intptr_t* shared, std::size_t offset) noexcept;
PERCPU_EXPORT void per_cpu_release(per_cpu_storage* storage, std::size_t bytes,
                                   std::intptr_t* shared, std::size_t shared_words) noexcept;
// The same four by concurrency id (cid_per_cpu<T>): the section set's copy
// is the thread's id's, the atomic set's its CPU's, and each raises the
// concurrency limit to cover the copy before it writes there.
PERCPU_EXPORT void per_cpu_cid_add_slow(per_cpu_storage* storage, std::size_t bytes,
                                        std::intptr_t* shared, std::size_t offset,
                                        std::intptr_t delta) noexcept;
PERCPU_EXPORT bool per_cpu_cid_compare_and_store(per_cpu_storage* storage, std::size_t bytes,
                                                 std::intptr_t* shared, std::size_t offset,
                                                 std::intptr_t expected,
                                                 std::intptr_t desired) noexcept;
PERCPU_EXPORT std::intptr_t per_cpu_cid_load(per_cpu_storage* storage, std::size_t bytes,
                                             std::intptr_t* shared, std::size_t offset) noexcept;
// Only the copies below the concurrency limit can have been written.
PERCPU_EXPORT void per_cpu_cid_release(per_cpu_storage* storage, std::size_t bytes,
                                       std::intptr_t* shared, std::size_t shared_words) noexcept;
// copy(cpu) with cpu outside [0, count): prints both and aborts.
[[noreturn]] PERCPU_EXPORT void per_cpu_index_out_of_range(int cpu, int count) noexcept;

}  // namespace internal

template <typename T>
class per_cpu {
  static_assert(std::is_trivially_copyable<T>::value, "per_cpu<T> copies T word by word");
  static_assert(sizeof(T) <= 4096, "a copy is at most 4096 bytes");
  static_assert(alignof(T) <= 16, "copies are 16-byte aligned");

 public:
  constexpr per_cpu() noexcept = default;
  ~per_cpu();
  per_cpu(const per_cpu&) = delete;
  per_cpu& operator=(const per_cpu&) = delete;

  template <typename M>
  void add(M T::*field, internal::same_as_t<M> delta) noexcept;
  template <typename M>
  bool compare_and_store(M T::*field, internal::same_as_t<M> expected,
                         internal::same_as_t<M> desired) noexcept;
  template <typename M>
  void store(M T::*field, internal::same_as_t<M> value) noexcept;
  template <typename M>
  M load(M T::*field) const noexcept;

  // CPU `cpu`'s copy: what sections running there wrote (copy()), what
  // threads without sections wrote while there (atomic_copy()). Valid cpus
  // are [0, cpus()); out of range: debug builds abort, release builds
  // return a zero T.
  T copy(int cpu) const noexcept;
  T atomic_copy(int cpu) const noexcept;
  T shared_copy() const noexcept;
  template <typename M>
  M sum(M T::*field) const noexcept;
  int cpus() const noexcept { return max_cpus(); }

 private:
  static constexpr std::size_t kCopyBytes = internal::per_cpu_copy_bytes(sizeof(T));
  static constexpr std::size_t kSharedWords =
      (sizeof(T) + sizeof(std::intptr_t) - 1) / sizeof(std::intptr_t);

  template <typename M>
  static constexpr void check_field() noexcept {
    static_assert(sizeof(M) == sizeof(std::intptr_t) &&
                      (std::is_integral<M>::value || std::is_pointer<M>::value),
                  "a field per_cpu updates is an 8-byte integer");
    static_assert(alignof(M) == sizeof(std::intptr_t), "the field is a whole aligned word");
  }
  // The field's byte offset in T, taken on the shared copy (a T's storage).
  template <typename M>
  std::size_t offset_of(M T::*field) const noexcept {
    const T* base = reinterpret_cast<const T*>(shared_);
    return static_cast<std::size_t>(reinterpret_cast<const char*>(&(base->*field)) -
                                    reinterpret_cast<const char*>(base));
  }
  static std::intptr_t to_word(std::intptr_t v) noexcept { return v; }
  template <typename M>
  static std::intptr_t to_word(M v) noexcept {
    std::intptr_t w;
    std::memcpy(&w, &v, sizeof(w));
    return w;
  }
  template <typename M>
  static M from_word(std::intptr_t w) noexcept {
    M v;
    std::memcpy(&v, &w, sizeof(v));
    return v;
  }
  // Reads `words` words at `from` one at a time into a T.
  static T snapshot(const std::intptr_t* from) noexcept {
    std::intptr_t buffer[kSharedWords];
    for (std::size_t i = 0; i < kSharedWords; ++i) {
      buffer[i] = __atomic_load_n(&from[i], __ATOMIC_RELAXED);
    }
    T out;
    std::memcpy(static_cast<void*>(&out), buffer, sizeof(T));
    return out;
  }

  T copy_from(const std::atomic<void*>& set, int cpu) const noexcept;
  template <typename Count>
  std::intptr_t sum_below(std::size_t offset, Count count) const noexcept;

  template <typename>
  friend class cid_per_cpu;  // the same object, indexed by concurrency id

  internal::per_cpu_storage storage_;
  std::intptr_t shared_[kSharedWords] = {};  // a T; only atomics touch it
};

// per_cpu<T> with its copies indexed by the thread's concurrency id (see
// "Indexed by concurrency id" above). The same members, with the same
// contracts, except where that section says.
template <typename T>
class cid_per_cpu : private per_cpu<T> {
  using base = per_cpu<T>;

 public:
  constexpr cid_per_cpu() noexcept = default;
  ~cid_per_cpu();
  cid_per_cpu(const cid_per_cpu&) = delete;
  cid_per_cpu& operator=(const cid_per_cpu&) = delete;

  template <typename M>
  void add(M T::*field, internal::same_as_t<M> delta) noexcept;
  template <typename M>
  bool compare_and_store(M T::*field, internal::same_as_t<M> expected,
                         internal::same_as_t<M> desired) noexcept;
  template <typename M>
  void store(M T::*field, internal::same_as_t<M> value) noexcept;
  template <typename M>
  M load(M T::*field) const noexcept;

  // Id `id`'s copy (copy()), CPU `id`'s atomic copy (atomic_copy()); valid
  // ids are [0, cpus()), and out of range as per_cpu's.
  using base::atomic_copy;
  using base::copy;
  using base::cpus;
  using base::shared_copy;
  // field summed over the copies of the ids used so far, both sets.
  template <typename M>
  M sum(M T::*field) const noexcept;
};

// ---- implementation -------------------------------------------------------

template <typename T>
per_cpu<T>::~per_cpu() {
  internal::per_cpu_release(&storage_, kCopyBytes, shared_, kSharedWords);
}

// The hot path, as counter::add: one section started with no test of the
// CPU (internal/rseq_cs.hpp) that adds to this CPU's copy; everything else
// (before start-up, no rseq, sections off, no copies yet) aborts there or
// finds no copies, and goes to the library.
template <typename T>
template <typename M>
inline void per_cpu<T>::add(M T::*field, internal::same_as_t<M> delta) noexcept {
  check_field<M>();
  const internal::section_start start = internal::start_section();
  char* copies = static_cast<char*>(storage_.copies.load(std::memory_order_relaxed));
  const std::size_t offset = offset_of(field);
  if (__builtin_expect(copies != nullptr, 1) &&
      __builtin_expect(internal::rseq_addv_started(
                           start,
                           reinterpret_cast<std::intptr_t*>(internal::stride_copy_at(copies, start) + offset),
                           to_word(delta)) == 0,
                       1)) {
    return;
  }
  internal::per_cpu_add_slow(&storage_, kCopyBytes, shared_, offset, to_word(delta));
}

template <typename T>
template <typename M>
bool per_cpu<T>::compare_and_store(M T::*field, internal::same_as_t<M> expected,
                                   internal::same_as_t<M> desired) noexcept {
  check_field<M>();
  return internal::per_cpu_compare_and_store(&storage_, kCopyBytes, shared_, offset_of(field),
                                             to_word(expected), to_word(desired));
}

// A compare-and-store of the value last read, again until nothing came in
// between: sections on this CPU write the copy with plain stores, so a plain
// store here could undo one of theirs.
template <typename T>
template <typename M>
void per_cpu<T>::store(M T::*field, internal::same_as_t<M> value) noexcept {
  check_field<M>();
  const std::size_t offset = offset_of(field);
  const std::intptr_t v = to_word(value);
  for (;;) {
    const std::intptr_t seen = internal::per_cpu_load(&storage_, kCopyBytes, shared_, offset);
    if (internal::per_cpu_compare_and_store(&storage_, kCopyBytes, shared_, offset, seen, v)) return;
  }
}

template <typename T>
template <typename M>
M per_cpu<T>::load(M T::*field) const noexcept {
  check_field<M>();
  auto* self = const_cast<per_cpu*>(this);  // the storage is read, never changed
  return from_word<M>(
      internal::per_cpu_load(&self->storage_, kCopyBytes, self->shared_, offset_of(field)));
}

template <typename T>
T per_cpu<T>::copy_from(const std::atomic<void*>& set, int cpu) const noexcept {
  static const std::intptr_t zero[kSharedWords] = {};
  const int count = cpus();
  if (cpu < 0 || cpu >= count) {
#ifndef NDEBUG
    internal::per_cpu_index_out_of_range(cpu, count);
#else
    return snapshot(zero);
#endif
  }
  const char* copies = static_cast<const char*>(set.load(std::memory_order_acquire));
  if (copies == nullptr) return snapshot(zero);
  return snapshot(reinterpret_cast<const std::intptr_t*>(
      internal::stride_copy(copies, static_cast<unsigned>(cpu))));
}

template <typename T>
T per_cpu<T>::copy(int cpu) const noexcept {
  return copy_from(storage_.copies, cpu);
}

template <typename T>
T per_cpu<T>::atomic_copy(int cpu) const noexcept {
  return copy_from(storage_.atomic_copies, cpu);
}

template <typename T>
T per_cpu<T>::shared_copy() const noexcept {
  return snapshot(shared_);
}

template <typename T>
template <typename M>
M per_cpu<T>::sum(M T::*field) const noexcept {
  check_field<M>();
  return from_word<M>(sum_below(offset_of(field), [] { return max_cpus(); }));
}

// The shared copy's word at `offset` plus that word of copies [0, count())
// of each set, `count` called after the set's pointer is loaded (a limit
// read then covers every write made before the set existed). Unsigned:
// the sum wraps as the field's own arithmetic would.
template <typename T>
template <typename Count>
std::intptr_t per_cpu<T>::sum_below(std::size_t offset, Count count) const noexcept {
  std::uintptr_t total = static_cast<std::uintptr_t>(__atomic_load_n(
      reinterpret_cast<const std::intptr_t*>(reinterpret_cast<const char*>(shared_) + offset),
      __ATOMIC_RELAXED));
  for (const std::atomic<void*>* set : {&storage_.copies, &storage_.atomic_copies}) {
    const char* copies = static_cast<const char*>(set->load(std::memory_order_acquire));
    if (copies == nullptr) continue;
    const int n = count();
    for (int c = 0; c < n; ++c) {
      const auto* word = reinterpret_cast<const std::intptr_t*>(
          internal::stride_copy(copies, static_cast<unsigned>(c)) + offset);
      total += static_cast<std::uintptr_t>(__atomic_load_n(word, __ATOMIC_RELAXED));
    }
  }
  return static_cast<std::intptr_t>(total);
}

// ---- cid_per_cpu ----------------------------------------------------------

// Gives back only the copies below the concurrency limit (the rest were
// never written); the base's destructor then finds nothing to give back.
template <typename T>
cid_per_cpu<T>::~cid_per_cpu() {
  internal::per_cpu_cid_release(&this->storage_, base::kCopyBytes, this->shared_,
                                base::kSharedWords);
}

// The hot path, as cid_counter::add: one section that reads the thread's
// concurrency id, tests it against the concurrency limit and adds at that
// id's copy (the field's word in copy 0 is the base the section strides
// from); a new high, no copies yet, no registration and an aborted section
// go to the library.
template <typename T>
template <typename M>
inline void cid_per_cpu<T>::add(M T::*field, internal::same_as_t<M> delta) noexcept {
  base::template check_field<M>();
  const internal::cid_start start = internal::start_cid_section();
  char* copies = static_cast<char*>(this->storage_.copies.load(std::memory_order_relaxed));
  const std::size_t offset = this->offset_of(field);
  if (__builtin_expect(copies != nullptr, 1) &&
      __builtin_expect(
          internal::rseq_addv_cid_started(start, reinterpret_cast<std::intptr_t*>(copies + offset),
                                          internal::concurrency_limit(), base::to_word(delta)) == 0,
          1)) {
    return;
  }
  internal::per_cpu_cid_add_slow(&this->storage_, base::kCopyBytes, this->shared_, offset,
                                 base::to_word(delta));
}

template <typename T>
template <typename M>
bool cid_per_cpu<T>::compare_and_store(M T::*field, internal::same_as_t<M> expected,
                                       internal::same_as_t<M> desired) noexcept {
  base::template check_field<M>();
  return internal::per_cpu_cid_compare_and_store(&this->storage_, base::kCopyBytes, this->shared_,
                                                 this->offset_of(field), base::to_word(expected),
                                                 base::to_word(desired));
}

// As per_cpu::store: a compare-and-store of the value last read, again
// until nothing came in between.
template <typename T>
template <typename M>
void cid_per_cpu<T>::store(M T::*field, internal::same_as_t<M> value) noexcept {
  base::template check_field<M>();
  const std::size_t offset = this->offset_of(field);
  const std::intptr_t v = base::to_word(value);
  for (;;) {
    const std::intptr_t seen =
        internal::per_cpu_cid_load(&this->storage_, base::kCopyBytes, this->shared_, offset);
    if (internal::per_cpu_cid_compare_and_store(&this->storage_, base::kCopyBytes, this->shared_,
                                                offset, seen, v)) {
      return;
    }
  }
}

template <typename T>
template <typename M>
M cid_per_cpu<T>::load(M T::*field) const noexcept {
  base::template check_field<M>();
  auto* self = const_cast<cid_per_cpu*>(this);  // the storage is read, never changed
  return base::template from_word<M>(internal::per_cpu_cid_load(
      &self->storage_, base::kCopyBytes, self->shared_, this->offset_of(field)));
}

// Every write made before the limit is loaded is below it
// (internal/concurrency_limit.hpp).
template <typename T>
template <typename M>
M cid_per_cpu<T>::sum(M T::*field) const noexcept {
  base::template check_field<M>();
  return base::template from_word<M>(this->sum_below(
      this->offset_of(field), [] { return static_cast<int>(internal::concurrency_limit()); }));
}

}  // namespace percpu
#pragma GCC visibility pop
