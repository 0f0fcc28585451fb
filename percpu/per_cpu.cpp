// The out-of-line half of percpu::per_cpu<T> (per_cpu.hpp), one for every T.

#include "percpu/per_cpu.hpp"

#include <unistd.h>

#include <cstdlib>

#include "percpu/internal/nocancel.hpp"
#include "percpu/internal/fallback.hpp"
#include "percpu/internal/registration.hpp"

namespace percpu {
namespace internal {
namespace {

std::intptr_t* field_word(void* copy, std::size_t offset) noexcept {
  return reinterpret_cast<std::intptr_t*>(static_cast<char*>(copy) + offset);
}

// One set of copies, taken from the per-CPU memory when an update first
// needs it. Racing first updates each take copies; one installs its own,
// the others give theirs back. nullptr while start-up cannot run (a handler
// interrupted it) and when no memory can be mapped: the update then goes to
// the shared copy.
void* set_or_allocate(std::atomic<void*>* set, std::size_t bytes) noexcept {
  void* current = set->load(std::memory_order_acquire);
  if (current != nullptr || !ensure_initialized()) return current;
  void* fresh = stride_arena_for(bytes).allocate();
  if (fresh == nullptr) return nullptr;
  if (set->compare_exchange_strong(current, fresh, std::memory_order_acq_rel,
                                   std::memory_order_acquire)) {
    return fresh;
  }
  stride_arena_for(bytes).deallocate(fresh);
  return current;
}

// The word of `offset` in copy `cpu` of `base`.
std::intptr_t* word_in(void* base, unsigned cpu, std::size_t offset) noexcept {
  return field_word(stride_copy(static_cast<char*>(base), cpu), offset);
}

// Where an update without a section goes: the atomic copy of the CPU the
// thread runs on (internal::cpu_hint(): a stale answer costs locality, not
// correctness, as only atomics write these copies), or the shared copy when
// no memory can be mapped for them. For cid_per_cpu (`by_id`) the CPU's
// index is the id threads without rseq have, and the concurrency limit is
// raised to cover it before the caller writes there.
std::intptr_t* word_without_section(per_cpu_storage* storage, std::size_t bytes,
                                    std::intptr_t* shared, std::size_t offset,
                                    bool by_id = false) noexcept {
  if (void* base = set_or_allocate(&storage->atomic_copies, bytes)) {
    const unsigned count = static_cast<unsigned>(max_cpus());
    const unsigned index = cpu_hint_index(count);
    if (by_id) raise_concurrency_limit(index);
    return word_in(base, index, offset);
  }
  return reinterpret_cast<std::intptr_t*>(reinterpret_cast<char*>(shared) + offset);
}

// Leaves the object as a constant-initialised one would be, so a late use
// from another static destructor reads zero and takes fresh copies. Only
// the copies below `written` can hold updates.
void release_sets(per_cpu_storage* storage, std::size_t bytes, std::intptr_t* shared,
                  std::size_t shared_words, unsigned written) noexcept {
  void* copies = storage->copies.exchange(nullptr, std::memory_order_acq_rel);
  void* atomic_copies = storage->atomic_copies.exchange(nullptr, std::memory_order_acq_rel);
  for (std::size_t i = 0; i < shared_words; ++i) __atomic_store_n(&shared[i], 0, __ATOMIC_RELAXED);
  if (copies != nullptr) stride_arena_for(bytes).deallocate(copies, written);
  if (atomic_copies != nullptr) stride_arena_for(bytes).deallocate(atomic_copies, written);
}

// The section set of a thread that can run sections by concurrency id, or
// nullptr. As cid_counter's slow path: sections only on the sections' area,
// and only for a thread that has a registration there.
void* cid_section_set(per_cpu_storage* storage, std::size_t bytes) noexcept {
  if (area_unless_known_missing() == nullptr) return nullptr;  // registers it where that is ours
  return set_or_allocate(&storage->copies, bytes);
}

// Runs `section(start, limit)` at the id the thread shows, after raising
// the limit to cover it (read outside the section, the id may have changed
// by the time the section reads its own, which then leaves with `beyond`
// if that one is not below the limit), until it returns something other
// than -1 or `beyond`, at most kSectionTries times: that value, or -1.
template <typename Section>
int cid_section(Section section, int beyond) noexcept {
  const unsigned count = static_cast<unsigned>(max_cpus());
  for (int tries = 0; tries < kSectionTries; ++tries) {
    const cid_start start = start_cid_section();
    const unsigned id = static_cast<unsigned>(started_concurrency_id(start));
    if (id >= count) break;  // no registration on the sections' area
    raise_concurrency_limit(id);
    const int r = section(start, concurrency_limit());
    if (r != -1 && r != beyond) return r;
  }
  return -1;
}

}  // namespace

void per_cpu_add_slow(per_cpu_storage* storage, std::size_t bytes, std::intptr_t* shared,
                      std::size_t offset, std::intptr_t delta) noexcept {
  // The section set only for a thread that runs sections: a process
  // without rseq never takes it.
  rseq_area* area = area_unless_known_missing();
  if (void* base = area != nullptr ? set_or_allocate(&storage->copies, bytes) : nullptr) {
    const unsigned count = static_cast<unsigned>(max_cpus());
    for (int tries = 0; tries < kSectionTries; ++tries) {
      const int cpu = rseq_current_index<index_kind::cpu_id>(area);
      if (static_cast<unsigned>(cpu) >= count) break;
      if (rseq_addv<index_kind::cpu_id>(area, word_in(base, static_cast<unsigned>(cpu), offset),
                                        delta, cpu) == 0) {
        return;
      }
    }
  }
  __atomic_fetch_add(word_without_section(storage, bytes, shared, offset), delta,
                     __ATOMIC_RELAXED);
}

bool per_cpu_compare_and_store(per_cpu_storage* storage, std::size_t bytes,
                               std::intptr_t* shared, std::size_t offset,
                               std::intptr_t expected, std::intptr_t desired) noexcept {
  rseq_area* area = area_unless_known_missing();
  if (void* base = area != nullptr ? set_or_allocate(&storage->copies, bytes) : nullptr) {
    const unsigned count = static_cast<unsigned>(max_cpus());
    for (int tries = 0; tries < kSectionTries; ++tries) {
      const int cpu = rseq_current_index<index_kind::cpu_id>(area);
      if (static_cast<unsigned>(cpu) >= count) break;
      const int r = rseq_cmpeqv_storev<index_kind::cpu_id>(
          area, word_in(base, static_cast<unsigned>(cpu), offset), expected, desired, cpu);
      if (r == 0) return true;
      if (r == 1) return false;
    }
  }
  return __atomic_compare_exchange_n(word_without_section(storage, bytes, shared, offset),
                                     &expected, desired, false, __ATOMIC_RELAXED,
                                     __ATOMIC_RELAXED);
}

// The word this thread's updates go to now: its CPU's copy when it runs
// sections, else word_without_section().
std::intptr_t per_cpu_load(per_cpu_storage* storage, std::size_t bytes, std::intptr_t* shared,
                           std::size_t offset) noexcept {
  void* base = storage->copies.load(std::memory_order_acquire);
  if (base != nullptr) {
    if (rseq_area* area = area_unless_known_missing()) {
      const unsigned cpu = static_cast<unsigned>(rseq_current_index<index_kind::cpu_id>(area));
      if (cpu < static_cast<unsigned>(max_cpus())) {
        return __atomic_load_n(word_in(base, cpu, offset), __ATOMIC_RELAXED);
      }
    }
  }
  return __atomic_load_n(word_without_section(storage, bytes, shared, offset), __ATOMIC_RELAXED);
}

void per_cpu_release(per_cpu_storage* storage, std::size_t bytes, std::intptr_t* shared,
                     std::size_t shared_words) noexcept {
  release_sets(storage, bytes, shared, shared_words, stride_arena::kEveryCopy);
}

void per_cpu_cid_add_slow(per_cpu_storage* storage, std::size_t bytes, std::intptr_t* shared,
                          std::size_t offset, std::intptr_t delta) noexcept {
  if (void* base = cid_section_set(storage, bytes)) {
    std::intptr_t* word = field_word(base, offset);
    if (cid_section(
            [&](cid_start start, std::uint32_t limit) {
              return rseq_addv_cid_started(start, word, limit, delta);
            },
            1) == 0) {
      return;
    }
  }
  __atomic_fetch_add(word_without_section(storage, bytes, shared, offset, true), delta,
                     __ATOMIC_RELAXED);
}

bool per_cpu_cid_compare_and_store(per_cpu_storage* storage, std::size_t bytes,
                                   std::intptr_t* shared, std::size_t offset,
                                   std::intptr_t expected, std::intptr_t desired) noexcept {
  if (void* base = cid_section_set(storage, bytes)) {
    std::intptr_t* word = field_word(base, offset);
    const int r = cid_section(
        [&](cid_start start, std::uint32_t limit) {
          return rseq_cmpeqv_storev_cid_started(start, word, limit, expected, desired);
        },
        2);
    if (r == 0) return true;
    if (r == 1) return false;
  }
  return __atomic_compare_exchange_n(word_without_section(storage, bytes, shared, offset, true),
                                     &expected, desired, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
}

// The word this thread's updates go to now: its id's copy when it runs
// sections (an id at or above the limit reads the zero its copy holds),
// else word_without_section(), by id.
std::intptr_t per_cpu_cid_load(per_cpu_storage* storage, std::size_t bytes, std::intptr_t* shared,
                               std::size_t offset) noexcept {
  void* base = storage->copies.load(std::memory_order_acquire);
  if (base != nullptr && area_unless_known_missing() != nullptr) {
    const unsigned id = static_cast<unsigned>(started_concurrency_id(start_cid_section()));
    if (id < static_cast<unsigned>(max_cpus())) {
      return __atomic_load_n(word_in(base, id, offset), __ATOMIC_RELAXED);
    }
  }
  return __atomic_load_n(word_without_section(storage, bytes, shared, offset, true),
                         __ATOMIC_RELAXED);
}

// Only the copies below the concurrency limit can have been written.
void per_cpu_cid_release(per_cpu_storage* storage, std::size_t bytes, std::intptr_t* shared,
                         std::size_t shared_words) noexcept {
  release_sets(storage, bytes, shared, shared_words, concurrency_limit());
}

void per_cpu_index_out_of_range(int cpu, int count) noexcept {
  char line[128] = "percpu::per_cpu<T>::copy(";
  std::size_t n = 0;
  while (line[n] != '\0') ++n;
  auto put_int = [&](int value) {
    char digits[12];
    int d = 0;
    unsigned magnitude =
        value < 0 ? 0u - static_cast<unsigned>(value) : static_cast<unsigned>(value);
    do {
      digits[d++] = static_cast<char>('0' + magnitude % 10);
      magnitude /= 10;
    } while (magnitude != 0);
    if (value < 0) line[n++] = '-';
    while (d > 0) line[n++] = digits[--d];
  };
  auto put = [&](const char* text) {
    while (*text != '\0') line[n++] = *text++;
  };
  put_int(cpu);
  put("): cpu out of range [0, ");
  put_int(count);
  put(")\n");
  nocancel_write(STDERR_FILENO, line, n);
  std::abort();
}

}  // namespace internal
}  // namespace percpu
