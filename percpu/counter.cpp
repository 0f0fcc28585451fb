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


}  // namespace

// Leaves the counter as a constant-initialised one would be, so a use after
// destruction (a static destructor of another translation unit that still
// counts) reads zero and takes fresh slots instead of writing given-back
// ones.
counter::~counter() {
  slot_words* s = slots_.exchange(nullptr, std::memory_order_acq_rel);
  unmapped_.store(0, std::memory_order_relaxed);
  if (s != nullptr) arena().deallocate(s);
}

// From the per-CPU memory: async-signal-safe (no malloc, no lock), and every
// slot zero. Racing first adds each take slots; one installs them, the
// others give theirs back. There are exactly max_cpus() slots: the hot path
// relies on that bound.
counter::slot_words* counter::allocate() noexcept {
  slot_words* fresh = static_cast<slot_words*>(arena().allocate());
  if (fresh == nullptr) return nullptr;
  slot_words* expected = nullptr;
  if (slots_.compare_exchange_strong(expected, fresh, std::memory_order_acq_rel,
                                     std::memory_order_acquire)) {
    return fresh;
  }
  arena().deallocate(fresh);
  return expected;
}

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
  // No rseq, or the sections kept aborting: any slot's atomic word is
  // correct; the current CPU's keeps the line local. internal::cpu_hint()
  // asks the fallback unless that is a system call, which it makes only
  // every so many adds.
  const unsigned cpu = static_cast<unsigned>(internal::cpu_hint());
  internal::stride_copy(s, cpu < count ? cpu : cpu % count)
      ->by_atomic.fetch_add(delta, std::memory_order_relaxed);
}

std::int64_t counter::slot(int cpu) const noexcept {
  const int count = slots();
  if (cpu < 0 || cpu >= count) {
#ifndef NDEBUG
    char line[96] = "percpu::counter::slot(";
    char* end = format_int(line + std::strlen(line), cpu);
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
  const slot_words* slots = slots_.load(std::memory_order_acquire);
  if (slots == nullptr) return 0;  // not mapped yet
  const slot_words& s = *internal::stride_copy(slots, static_cast<unsigned>(cpu));
  return read_rseq_word(&s.by_rseq) + s.by_atomic.load(std::memory_order_relaxed);
}

int counter::slots() const noexcept { return max_cpus(); }

}  // namespace percpu
