// percpu::counter: the slow path (first add, aborted sections, no rseq) and
// the readers.

#include "percpu/counter.hpp"
#include "percpu/internal/fallback.hpp"
#include "percpu/internal/nocancel.hpp"

#include <unistd.h>

#include <cstdlib>
#include <cstring>

namespace percpu {

static_assert(sizeof(std::intptr_t) == sizeof(std::int64_t) || !internal::kHaveRseqSections,
              "rseq sections add to a 64-bit word");

namespace {

internal::stride_arena& arena() noexcept { return internal::stride_arena_for(16); }

// Reads a word that rseq sections on another CPU write with plain stores.
std::int64_t read_rseq_word(const std::intptr_t* word) {
  return static_cast<std::int64_t>(__atomic_load_n(word, __ATOMIC_RELAXED));
}

// Formats `value` in decimal into `out` (at least 12 bytes); returns its end.
// Used only by the debug-build range check.
[[maybe_unused]] char* format_int(char* out, int value) {
  char digits[12];
  int n = 0;
  unsigned magnitude = value < 0 ? 0u - static_cast<unsigned>(value) : static_cast<unsigned>(value);
  do {
    digits[n++] = static_cast<char>('0' + magnitude % 10);
    magnitude /= 10;
  } while (magnitude != 0);
  if (value < 0) *out++ = '-';
  while (n > 0) *out++ = digits[--n];
  return out;
}

// From the per-CPU memory: async-signal-safe (no malloc, no lock), and every
// slot zero. Racing first adds each take slots; one installs them, the
// others give theirs back. There are exactly max_cpus() slots: the hot
// paths rely on that bound.
template <class Words>
Words* install_words(std::atomic<Words*>& slots) noexcept {
  auto* fresh = static_cast<Words*>(arena().allocate());
  if (fresh == nullptr) return nullptr;
  Words* expected = nullptr;
  if (slots.compare_exchange_strong(expected, fresh, std::memory_order_acq_rel,
                                    std::memory_order_acquire)) {
    return fresh;
  }
  arena().deallocate(fresh);
  return expected;
}

// Leaves a counter as a constant-initialised one would be, so a use after
// destruction (a static destructor of another translation unit that still
// counts) reads zero and takes fresh slots instead of writing given-back
// ones. Only the slots below `written` can hold adds.
template <class Words>
void release_words(std::atomic<Words*>& slots, std::atomic<std::int64_t>& unmapped,
                   unsigned written) noexcept {
  Words* s = slots.exchange(nullptr, std::memory_order_acq_rel);
  unmapped.store(0, std::memory_order_relaxed);
  if (s != nullptr) arena().deallocate(s, written);
}

// slot(index) of either counter; `who` names it in the debug build's
// message about an index out of range.
template <class Words>
std::int64_t read_slot(const std::atomic<Words*>& slots, int index,
                       [[maybe_unused]] const char* who) noexcept {
  const int count = max_cpus();
  if (index < 0 || index >= count) {
#ifndef NDEBUG
    char line[96];
    const std::size_t who_length = std::strlen(who);
    std::memcpy(line, who, who_length);
    char* end = format_int(line + who_length, index);
    const char middle[] = "): index out of range [0, ";
    std::memcpy(end, middle, sizeof(middle) - 1);
    end = format_int(end + sizeof(middle) - 1, count);
    *end++ = ')';
    *end++ = '\n';
    internal::nocancel_write(STDERR_FILENO, line, static_cast<std::size_t>(end - line));
    std::abort();
#else
    return 0;
#endif
  }
  const Words* words = slots.load(std::memory_order_acquire);
  if (words == nullptr) return 0;  // not mapped yet
  const Words& w = *internal::stride_copy(words, static_cast<unsigned>(index));
  return read_rseq_word(&w.by_rseq) + w.by_atomic.load(std::memory_order_relaxed);
}

// No rseq, or the sections kept aborting: any slot's atomic word is correct;
// the current CPU's keeps the line local. internal::cpu_hint() asks the
// fallback unless that is a system call, which it makes only every so many
// adds.
unsigned atomic_index(unsigned count) noexcept { return internal::cpu_hint_index(count); }
template <class Words>
void add_atomically(Words* s, unsigned index, std::int64_t delta) noexcept {
  internal::stride_copy(s, index)->by_atomic.fetch_add(delta, std::memory_order_relaxed);
}

}  // namespace

counter::~counter() { release_words(slots_, unmapped_, internal::stride_arena::kEveryCopy); }

counter::slot_words* counter::allocate() noexcept { return install_words(slots_); }

void counter::add_slow(std::int64_t delta) noexcept {
  using internal::index_kind;
  slot_words* s = slots_.load(std::memory_order_acquire);
  // The slots are max_cpus() copies, known once start-up has run; the only
  // add that can find start-up still running (in another thread, or in the
  // code this signal handler interrupted) counts on the side.
  if (s == nullptr && internal::ensure_initialized()) s = allocate();
  if (s == nullptr) {
    unmapped_.fetch_add(delta, std::memory_order_relaxed);
    return;
  }
  const unsigned count = static_cast<unsigned>(max_cpus());
  if (internal::rseq_area* area = internal::area_unless_known_missing()) {
    for (int tries = 0; tries < internal::kSectionTries; ++tries) {
      const int cpu = internal::rseq_current_index<index_kind::cpu_id>(area);
      if (static_cast<unsigned>(cpu) >= count) break;
      std::intptr_t* word = &internal::stride_copy(s, static_cast<unsigned>(cpu))->by_rseq;
      if (internal::rseq_addv<index_kind::cpu_id>(area, word, static_cast<std::intptr_t>(delta),
                                                  cpu) == 0) {
        return;
      }
    }
  }
  add_atomically(s, atomic_index(count), delta);
}

std::int64_t counter::slot(int cpu) const noexcept {
  return read_slot(slots_, cpu, "percpu::counter::slot(");
}

int counter::slots() const noexcept { return max_cpus(); }

// Only the ids below the concurrency limit can have been written: the
// destructor reads and zeroes those alone.
cid_counter::~cid_counter() { release_words(slots_, unmapped_, internal::concurrency_limit()); }

cid_counter::slot_words* cid_counter::allocate() noexcept { return install_words(slots_); }

// As counter::add_slow(), by concurrency id: the section again, after
// raising the limit to cover the id the thread shows (read outside the
// section, it may have changed by the time the section reads its own, which
// then leaves again if that one is not below the limit), then the atomic
// word of the CPU's index, which is the id threads without rseq have.
// Sections only on the sections' area: where that is not the thread's area
// (start-up could not prove max_cpus() a bound on every id), the id reads
// as none and the add takes the atomic word.
void cid_counter::add_slow(std::int64_t delta) noexcept {
  slot_words* s = slots_.load(std::memory_order_acquire);
  if (s == nullptr && internal::ensure_initialized()) s = allocate();
  if (s == nullptr) {
    unmapped_.fetch_add(delta, std::memory_order_relaxed);
    return;
  }
  const unsigned count = static_cast<unsigned>(max_cpus());
  // Registers the thread first where that is percpu's job.
  if (internal::area_unless_known_missing() != nullptr) {
    for (int tries = 0; tries < internal::kSectionTries; ++tries) {
      const internal::cid_start start = internal::start_cid_section();
      const unsigned id = static_cast<unsigned>(internal::started_concurrency_id(start));
      if (id >= count) break;
      internal::raise_concurrency_limit(id);
      if (internal::rseq_addv_cid_started(start, &s->by_rseq, internal::concurrency_limit(),
                                          static_cast<std::intptr_t>(delta)) == 0) {
        return;
      }
    }
  }
  // The limit must cover the index before the add lands there.
  const unsigned index = atomic_index(count);
  internal::raise_concurrency_limit(index);
  add_atomically(s, index, delta);
}

std::int64_t cid_counter::slot(int id) const noexcept {
  return read_slot(slots_, id, "percpu::cid_counter::slot(");
}

int cid_counter::slots() const noexcept { return max_cpus(); }

}  // namespace percpu
