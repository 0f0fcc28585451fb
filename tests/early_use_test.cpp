// percpu used before its own constructor has run, the way real programs do:
//   - a priority-101 constructor in the program's own object, which the
//     linker orders before libpercpu.a's (same priority, earlier on the link
//     line): the inline cpu_id(), node_id(), concurrency_id() and
//     counter::add();
//   - a malloc replacement that asks cpu_id() on its first allocation, which
//     in a dynamic program happens inside the C++ runtime's own start-up,
//     before any constructor of this program.
// Built as a PIE, a non-PIE and a static program (see tests/CMakeLists.txt).
// Every id must be in [0, max_cpus()), every count exact, and the thread
// control block untouched (an early section once armed it as an rseq area,
// overwriting the word at offset 8).
#include <malloc.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "percpu/counter.hpp"
#include "percpu/cpu.hpp"
#include "percpu/internal/registration.hpp"
#include "percpu/internal/thread_pointer.hpp"
#include "percpu/per_cpu.hpp"

extern "C" void* __libc_malloc(std::size_t);
extern "C" void __libc_free(void*);
extern "C" void* __libc_calloc(std::size_t, std::size_t);
extern "C" void* __libc_realloc(void*, std::size_t);
extern "C" void* __libc_memalign(std::size_t, std::size_t);

namespace {

struct early_record {
  int cpu = -100, node = -100, cid = -100;
  std::uintptr_t tcb_words_before[4] = {};
  std::uintptr_t tcb_words_after[4] = {};
  // Whether start-up had run when the constructor began, and whether the
  // structures' inline gate then refused every area (it must: the sections'
  // area is the unregistered one until start-up aims it).
  bool started_before = false;
  bool sections_gate_refused = false;
  bool ran = false;
};

early_record g_constructor;
[[maybe_unused]] std::atomic<int> g_malloc_cpu{-100};
[[maybe_unused]] std::atomic<bool> g_malloc_asked{false};

// Statically initialised, so usable in the earliest constructor.
percpu::counter g_early_counter;
struct early_fields {
  std::int64_t adds;
  std::int64_t last;
};
percpu::per_cpu<early_fields> g_early_per_cpu;
percpu::cid_per_cpu<early_fields> g_early_cid_per_cpu;
constexpr int kEarlyAdds = 1000;

void read_tcb(std::uintptr_t (&words)[4]) {
  const auto* tcb = reinterpret_cast<const std::uintptr_t*>(percpu::internal::thread_pointer());
  for (int i = 0; i < 4; ++i) words[i] = tcb[i];
}

}  // namespace

// No malloc replacement where one cannot work: in a static program glibc's
// archive defines both names in one object, and a sanitizer's runtime owns
// the heap.
#if defined(PERCPU_EARLY_USE_STATIC) || defined(__SANITIZE_ADDRESS__) || \
    defined(__SANITIZE_THREAD__)
#define PERCPU_EARLY_USE_NO_MALLOC 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define PERCPU_EARLY_USE_NO_MALLOC 1
#endif
#endif

#ifndef PERCPU_EARLY_USE_NO_MALLOC
// The malloc family, forwarded to glibc's. Only the first call asks percpu;
// later ones must not recurse into it while percpu allocates nothing anyway.
extern "C" void* malloc(std::size_t size) {
  if (!g_malloc_asked.exchange(true)) g_malloc_cpu.store(percpu::cpu_id());
  return __libc_malloc(size);
}
extern "C" void free(void* p) { __libc_free(p); }
extern "C" void* calloc(std::size_t n, std::size_t size) { return __libc_calloc(n, size); }
extern "C" void* realloc(void* p, std::size_t size) { return __libc_realloc(p, size); }
extern "C" void* memalign(std::size_t align, std::size_t size) {
  return __libc_memalign(align, size);
}
extern "C" void* aligned_alloc(std::size_t align, std::size_t size) {
  return __libc_memalign(align, size);
}
extern "C" int posix_memalign(void** out, std::size_t align, std::size_t size) {
  void* p = __libc_memalign(align, size);
  if (p == nullptr) return ENOMEM;
  *out = p;
  return 0;
}
#endif

__attribute__((constructor(101))) static void use_percpu_first() {
  read_tcb(g_constructor.tcb_words_before);
  g_constructor.started_before =
      percpu::internal::g_init_state.load() != percpu::internal::kInitNotStarted;
  g_constructor.sections_gate_refused =
      percpu::internal::sections_area_if_registered() == nullptr;
  g_constructor.cpu = percpu::cpu_id();
  g_constructor.node = percpu::node_id();
  g_constructor.cid = percpu::concurrency_id();
  for (int i = 0; i < kEarlyAdds; ++i) {
    g_early_counter.increment();
    g_early_per_cpu.add(&early_fields::adds, 1);
    g_early_cid_per_cpu.add(&early_fields::adds, 1);
  }
  g_early_per_cpu.store(&early_fields::last, 7);
  read_tcb(g_constructor.tcb_words_after);
  g_constructor.ran = true;
}

namespace {

int kernel_cpu() {
  unsigned cpu = 0;
  syscall(SYS_getcpu, &cpu, nullptr, nullptr);
  return static_cast<int>(cpu);
}

TEST(EarlyUse, ConstructorBeforePercpusSawValidIds) {
  ASSERT_TRUE(g_constructor.ran);
  const int max = percpu::max_cpus();
  EXPECT_GE(g_constructor.cpu, 0);
  EXPECT_LT(g_constructor.cpu, max);
  EXPECT_GE(g_constructor.node, 0);
  EXPECT_LT(g_constructor.node, 1 << 16);
  EXPECT_GE(g_constructor.cid, 0);
  EXPECT_LT(g_constructor.cid, max);
}

TEST(EarlyUse, ConstructorBeforePercpusLeftTheThreadControlBlockAlone) {
  ASSERT_TRUE(g_constructor.ran);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(g_constructor.tcb_words_before[i], g_constructor.tcb_words_after[i])
        << "word " << i << " of the thread control block changed";
  }
  // The thread still reaches its TLS (the DTV), and so do new threads.
  std::thread t([] { EXPECT_GE(percpu::cpu_id(), 0); });
  t.join();
}

// Before start-up the structures' sections must not arm any area: the
// sections' offset leads to the unregistered area from the first instruction
// on (0 would lead to the thread control block, whose words a section would
// take for a registered area and overwrite). In a dynamic program the malloc
// replacement may have run start-up already; then there is nothing to check.
TEST(EarlyUse, BeforeStartupTheSectionsGateRefusesEveryArea) {
  ASSERT_TRUE(g_constructor.ran);
  if (g_constructor.started_before) {
    GTEST_SKIP() << "start-up ran before this constructor (the first malloc asked cpu_id())";
  }
  EXPECT_TRUE(g_constructor.sections_gate_refused)
      << "before start-up the sections' area showed a CPU";
}

TEST(EarlyUse, EarlyAddsAreCounted) {
  ASSERT_TRUE(g_constructor.ran);
  for (int i = 0; i < kEarlyAdds; ++i) g_early_counter.increment();
  EXPECT_EQ(g_early_counter.load(), 2 * kEarlyAdds);
}

// per_cpu.hpp: "Constant-initialised: a global per_cpu works from any
// constructor": the early constructor's updates, of both forms, are all
// in the sums, and its store in one copy of one set or the other.
TEST(EarlyUse, EarlyPerCpuUpdatesAreCounted) {
  ASSERT_TRUE(g_constructor.ran);
  for (int i = 0; i < kEarlyAdds; ++i) g_early_per_cpu.add(&early_fields::adds, 1);
  EXPECT_EQ(g_early_per_cpu.sum(&early_fields::adds), 2 * kEarlyAdds);
  EXPECT_EQ(g_early_cid_per_cpu.sum(&early_fields::adds), kEarlyAdds);
  EXPECT_EQ(g_early_per_cpu.sum(&early_fields::last), 7);
}

#ifndef PERCPU_EARLY_USE_NO_MALLOC
TEST(EarlyUse, FirstMallocSawAValidId) {
  if (std::getenv("PERCPU_UNDER_VALGRIND") != nullptr) {
    GTEST_SKIP() << "valgrind replaces the program's malloc with its own";
  }
  ASSERT_TRUE(g_malloc_asked.load()) << "the malloc replacement was never called";
  EXPECT_GE(g_malloc_cpu.load(), 0);
  EXPECT_LT(g_malloc_cpu.load(), percpu::max_cpus());
}
#endif

TEST(EarlyUse, LaterIdsMatchTheKernel) {
  int matched = 0;
  for (int i = 0; i < 1000 && matched == 0; ++i) {
    const int before = kernel_cpu();
    const int id = percpu::cpu_id();
    const int after = kernel_cpu();
    if (before == after && id == before) ++matched;
  }
  EXPECT_GT(matched, 0);
}

}  // namespace
