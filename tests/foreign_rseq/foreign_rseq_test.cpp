// percpu beside another library that registered rseq first (registrant.c),
// with glibc's registration off: percpu must find that library's area
// through the convention it publishes, check it with the kernel, and share
// it for reads (and for sections when the signature is percpu's), on the
// threads that library registered only. Every other thread gets percpu's own
// registration, and a thread whose registrant percpu cannot find falls back
// alone. Where the registrant publishes librseq's rseq_offset, the inline
// paths read its area from the first sharing on (cpu_id(), and sections with
// the common signature), and threads it left alone still get the right
// answer from the slow path. Built once per registrant kind (REGISTRANT_KIND).
#include <gtest/gtest.h>
#include <pthread.h>
#include <sched.h>
#include <sys/auxv.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "percpu/counter.hpp"
#include "percpu/cpu.hpp"
#include "percpu/internal/registration.hpp"
#include "percpu/internal/rseq_cs.hpp"
#include "percpu/internal/thread_pointer.hpp"
#include "tests/support/expected_sections.hpp"

extern "C" {
int test_registrant_register(void);
void* test_registrant_area(void);
unsigned test_registrant_length(void);
int test_registrant_constructor_result(void);
}

namespace {

using percpu::rseq_owner;

const std::string kKind = REGISTRANT_KIND;
// Whether percpu can find the registrant's area, and run sections on it.
const bool kFindable = kKind != "hidden";
const bool kSections = kKind == "librseq" || kKind == "abi";
// Whether the inline paths may read its area: librseq's convention promises
// an offset from the thread pointer that holds in every thread.
const bool kServedInline = kKind == "librseq" || kKind == "othersig";

void require_registrant_first() {
  const int result = test_registrant_constructor_result();
  ASSERT_EQ(result, 0) << "the registrant could not register the main thread (errno " << result
                       << "): glibc's rseq must be off (GLIBC_TUNABLES="
                       << "glibc.pthread.rseq=0) and the kernel must have rseq";
}

int registrant_cpu_id() {
  const auto* area = static_cast<const volatile std::int32_t*>(test_registrant_area());
  return area[1];  // struct rseq's cpu_id
}

std::intptr_t registrant_offset() {
  return static_cast<char*>(test_registrant_area()) - percpu::internal::thread_pointer();
}

// Pins the calling thread to each allowed CPU in turn and checks that
// cpu_id() follows; with the registrant's area, that the area follows too
// (a thread the registrant left alone has no area of its own to check).
enum class also_check { nothing, registrant_area };
void expect_cpu_id_follows(also_check also = also_check::nothing) {
  cpu_set_t allowed;
  ASSERT_EQ(sched_getaffinity(0, sizeof(allowed), &allowed), 0);
  int checked = 0;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &allowed)) continue;
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    ASSERT_EQ(sched_setaffinity(0, sizeof(one), &one), 0);
    EXPECT_EQ(percpu::cpu_id(), cpu);
    if (also == also_check::registrant_area) {
      EXPECT_EQ(registrant_cpu_id(), cpu);
    }
    ++checked;
  }
  ASSERT_EQ(sched_setaffinity(0, sizeof(allowed), &allowed), 0);
  EXPECT_GT(checked, 0);
}

void expect_follows_cpus() { expect_cpu_id_follows(also_check::registrant_area); }

TEST(ForeignRseq, SharesTheRegistrantsAreaOnItsThreads) {
  require_registrant_first();
  if (kFindable) {
    EXPECT_EQ(percpu::rseq_ownership(), rseq_owner::other);
    EXPECT_EQ(percpu::backend(), percpu::cpu_backend::rseq);
    EXPECT_EQ(percpu::internal::rseq_registration_length(), test_registrant_length());
    EXPECT_EQ(percpu::internal::rseq_registration_error(), 0);
  } else {
    EXPECT_EQ(percpu::rseq_ownership(), rseq_owner::none)
        << "no convention finds this registrant: this thread falls back";
    EXPECT_NE(percpu::backend(), percpu::cpu_backend::rseq);
    EXPECT_EQ(percpu::internal::rseq_registration_error(), EINVAL);
  }
  expect_follows_cpus();
}

TEST(ForeignRseq, SectionsRunOnTheSharedAreaOnlyWithTheCommonSignature) {
  require_registrant_first();
  percpu::internal::rseq_area* area = percpu::internal::rseq_area_for_sections();
  if (kSections && percpu::internal::rseq_sections_enabled()) {
    EXPECT_EQ(static_cast<void*>(area), test_registrant_area());
  } else {
    EXPECT_EQ(area, nullptr) << "sections must not run on an area registered with another "
                                "signature, nor without a registration";
  }
  // The public answer says which: on with the common signature, the foreign
  // signature where the area is found but registered with another, no rseq
  // where no convention finds it.
  const percpu::sections thread_reason = kSections   ? percpu::sections::on
                                         : kFindable ? percpu::sections::foreign_signature
                                                     : percpu::sections::no_rseq;
  EXPECT_STREQ(percpu::to_string(percpu::sections_status()),
               percpu::to_string(percpu::test::expected_sections(thread_reason)));
  EXPECT_EQ(percpu::sections_status() == percpu::sections::on, area != nullptr);
  // A thread the registrant left alone is percpu's, and runs sections.
  percpu::sections other_thread = percpu::sections::starting;
  std::thread([&] { other_thread = percpu::sections_status(); }).join();
  EXPECT_STREQ(percpu::to_string(other_thread),
               percpu::to_string(percpu::test::expected_sections(percpu::sections::on)));
}

// After the first thread shares the registrant's area, cpu_id() reads it
// inline where librseq's convention names it (the inline load is an answer
// on the registrant's threads), and sections run inline on it only with the
// common signature. Threads the registrant left alone answer right anyway.
TEST(ForeignRseq, TheInlinePathReadsTheRegistrantsArea) {
  require_registrant_first();
  (void)percpu::cpu_id();  // the first call shares the area
  const percpu::internal::fast_path_offsets& fast = percpu::internal::g_fast_path;
  const std::intptr_t offset = registrant_offset();
  const int loaded = percpu::internal::load_tp_relative_i32(fast.cpu_id);
  if (kServedInline) {
    EXPECT_EQ(fast.cpu_id, offset + 4) << "cpu_id() does not read the registrant's area inline";
    EXPECT_GE(loaded, 0) << "the inline load is no answer on the registrant's own thread";
    EXPECT_EQ(fast.area == offset, kSections)
        << "sections must read the area inline exactly when its signature is percpu's";
  } else {
    EXPECT_NE(fast.cpu_id, offset + 4) << "an area nothing promises for every thread was aimed at";
    EXPECT_NE(fast.area, offset);
  }
  expect_follows_cpus();

  // A thread the registrant left alone: its area there holds -1, so the
  // inline load is refused and percpu's own registration answers.
  int alone_loaded = 0;
  rseq_owner alone_owner = rseq_owner::none;
  percpu::sections alone_sections = percpu::sections::starting;
  std::thread([&] {
    alone_loaded = percpu::internal::load_tp_relative_i32(fast.cpu_id);
    expect_cpu_id_follows();
    alone_owner = percpu::rseq_ownership();
    alone_sections = percpu::sections_status();
  }).join();
  if (kServedInline) {
    EXPECT_LT(alone_loaded, 0);
  }
  EXPECT_EQ(alone_owner, rseq_owner::percpu);
  EXPECT_STREQ(percpu::to_string(alone_sections),
               percpu::to_string(percpu::test::expected_sections(percpu::sections::on)));

  // A thread the registrant registered that percpu never saw before: the
  // inline path answers there at once, and the queries name the registrant.
  int registered = -1;
  int first_loaded = -1;
  rseq_owner owner = rseq_owner::percpu;
  unsigned length = 0;
  std::thread([&] {
    registered = test_registrant_register();
    if (registered != 0) return;
    first_loaded = percpu::internal::load_tp_relative_i32(fast.cpu_id);
    owner = percpu::rseq_ownership();
    length = percpu::internal::rseq_registration_length();
    expect_follows_cpus();
  }).join();
  ASSERT_EQ(registered, 0);
  if (kServedInline) {
    EXPECT_GE(first_loaded, 0);
  }
  EXPECT_EQ(owner, kFindable ? rseq_owner::other : rseq_owner::none);
  if (kFindable) {
    EXPECT_EQ(length, test_registrant_length());
  }
}

TEST(ForeignRseq, OtherThreadsAreRegisteredByPercpu) {
  require_registrant_first();
  rseq_owner seen = rseq_owner::none;
  percpu::cpu_backend backend = percpu::cpu_backend::syscall;
  std::thread([&] {
    seen = percpu::rseq_ownership();
    backend = percpu::backend();
  }).join();
  EXPECT_EQ(seen, rseq_owner::percpu) << "a thread the registrant left alone is percpu's";
  EXPECT_EQ(backend, percpu::cpu_backend::rseq);
}

TEST(ForeignRseq, ThreadsRegisteredByTheRegistrantShareToo) {
  require_registrant_first();
  rseq_owner seen = rseq_owner::percpu;
  int registered = -1;
  std::thread([&] {
    registered = test_registrant_register();
    if (registered == 0) {
      seen = percpu::rseq_ownership();
      expect_follows_cpus();
    }
  }).join();
  ASSERT_EQ(registered, 0);
  EXPECT_EQ(seen, kFindable ? rseq_owner::other : rseq_owner::none);
}

// Threads of both kinds (registrant's and percpu's) add to one counter while
// the scheduler moves them: not one increment may be lost or doubled.
TEST(ForeignRseq, CounterIsExactAcrossRegistrants) {
  require_registrant_first();
  percpu::counter total;
  constexpr int kThreads = 4;
  constexpr long kAdds = 20000;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      if (t % 2 == 0 && test_registrant_register() != 0) failures.fetch_add(1);
      for (long i = 0; i < kAdds; ++i) {
        total.add(1);
        if (i % 1024 == 0) sched_yield();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(total.load(), kThreads * kAdds);
}

}  // namespace
