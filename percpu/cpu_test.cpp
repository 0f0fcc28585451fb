// Correctness of cpu_id() and friends against the kernel's own answer, for
// every backend this machine has, from every context the API promises.
//
// Environment (set by the ctest variants in percpu/CMakeLists.txt):
//   PERCPU_EXPECT_OWNER   glibc | percpu | none: the rseq owner this run must see
//   PERCPU_EXPECT_BACKEND the backend the main thread must be served by
//   PERCPU_EXPECT_SECTIONS what sections_status() must say for the main thread
//                         (tests/support/expected_sections.hpp)

#include "percpu/cpu.hpp"

#include <gtest/gtest.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/auxv.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "percpu/internal/environment.hpp"
#include "percpu/internal/fallback.hpp"
#include "percpu/internal/registration.hpp"
#include "percpu/internal/rseq_cs.hpp"
#include "percpu/percpu.h"
#include "tests/support/expected_backend.hpp"
#include "tests/support/expected_sections.hpp"
#include "tools/seccomp_deny_rseq.hpp"

namespace percpu {
namespace {

struct kernel_answer {
  int cpu;
  int node;
};

kernel_answer ask_kernel() {
  unsigned cpu = 0, node = 0;
  EXPECT_EQ(internal::raw_syscall_getcpu(&cpu, &node), 0);
  return {static_cast<int>(cpu), static_cast<int>(node)};
}

using test::allowed_cpus;
using test::pin_to;

// The backends to check answers from: rseq where it registers, and each
// fallback percpu finds usable that the host offers on every CPU
// (tests/support/expected_backend.hpp). The two judgements must agree
// (CpuMode.EachFallbackUsableExactlyWhereTheHostOffersIt); where they cannot
// (qemu-user's vDSO getcpu answers 0 on every CPU, which percpu's check on
// one CPU cannot tell from a right answer on CPU 0), the emulated variant
// leaves that test out and this list the backend.
std::vector<cpu_backend> usable_backends() {
  std::vector<cpu_backend> result;
  if (internal::force_backend(cpu_backend::rseq)) result.push_back(cpu_backend::rseq);
  for (cpu_backend b : {cpu_backend::rdpid, cpu_backend::vdso, cpu_backend::syscall}) {
    if (internal::fallback_usable(b, nullptr) && test::host_offers(b)) result.push_back(b);
  }
  return result;
}

// Everything the API promises about one pinned CPU, checked on the calling thread.
// Returns a description of the first mismatch, or an empty string.
std::string check_pinned(int cpu) {
  const kernel_answer k = ask_kernel();
  if (k.cpu != cpu) return "pinning to " + std::to_string(cpu) + " did not take";
  const int got = cpu_id();
  if (got != cpu) return "cpu_id()=" + std::to_string(got) + " on CPU " + std::to_string(cpu);
  if (percpu_cpu_id() != cpu) return "percpu_cpu_id() wrong on CPU " + std::to_string(cpu);
  if (percpu_sched_getcpu() != cpu)
    return "percpu_sched_getcpu() wrong on CPU " + std::to_string(cpu);
  if (node_id() != k.node)
    return "node_id()=" + std::to_string(node_id()) + " want " + std::to_string(k.node);
  if (percpu_node_id() != k.node) return "percpu_node_id() wrong";
  const int cid = concurrency_id();
  if (cid < 0 || cid >= max_cpus()) return "concurrency_id() out of range: " + std::to_string(cid);
  if (cpu >= max_cpus()) return "max_cpus() too small for CPU " + std::to_string(cpu);
  return "";
}

// Each test forces backends in turn; TearDown puts back what SetUp found
// (the serving backend and the fallback) and checks that it did, so a test
// that leaves another backend behind fails itself instead of quietly running
// the tests after it in a mode their variant does not name.
class BackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    backend_before_ = backend();
    fallback_before_ = fallback_backend();
  }
  void TearDown() override {
    // Forcing the old fallback first resets the fallback; forcing rseq
    // afterwards puts rseq back where it served.
    EXPECT_TRUE(internal::force_backend(fallback_before_)) << to_string(fallback_before_);
    if (backend_before_ == cpu_backend::rseq) {
      EXPECT_TRUE(internal::force_backend(cpu_backend::rseq));
    }
    EXPECT_STREQ(to_string(backend()), to_string(backend_before_))
        << "the backend serving this thread was not restored";
    EXPECT_STREQ(to_string(fallback_backend()), to_string(fallback_before_))
        << "the fallback was not restored";
  }

 private:
  cpu_backend backend_before_ = cpu_backend::syscall;
  cpu_backend fallback_before_ = cpu_backend::syscall;
};

// The fallback start-up chose, taken before any test forces another one.
const cpu_backend g_fallback_at_start = fallback_backend();

// The fallback that start-up must choose when nothing forces one: the
// fastest the host offers (tests/support/expected_backend.hpp).
cpu_backend expected_unforced_fallback() { return test::documented_fallback(cpu_backend::rdpid); }

// The mode this run exercised, printed and, where the ctest variant says which
// mode it is for, asserted.
TEST(CpuMode, PrintedAndAsExpected) {
  const int id = cpu_id();
  std::printf(
      "percpu mode: owner=%s backend=%s fallback=%s rseq_feature_size=%u max_cpus=%d "
      "registration_error=%d cpu=%d\n",
      to_string(rseq_ownership()), to_string(backend()), to_string(fallback_backend()),
      rseq_feature_size(), max_cpus(), internal::rseq_registration_error(), id);
  if (const char* want = std::getenv("PERCPU_EXPECT_OWNER")) {
    EXPECT_STREQ(to_string(rseq_ownership()), want);
  }
  if (const char* want = std::getenv("PERCPU_EXPECT_BACKEND")) {
    std::string why;
    const std::string expected = test::expected_backend(want, &why);
    std::printf("checked backend %s: %s\n", expected.c_str(), why.c_str());
    EXPECT_EQ(to_string(backend()), expected) << why;
  }
  if (const char* want = std::getenv("PERCPU_EXPECT_RSEQ_ERROR")) {
    EXPECT_EQ(internal::rseq_registration_error(), std::atoi(want));
  }
  if (backend() == cpu_backend::rseq) {
    EXPECT_GE(rseq_feature_size(), 20u);
  }
}

// The public answer to "do the structures run rseq sections here?" is what
// the structures get: an area exactly when it says on, in every variant
// (PERCPU_EXPECT_SECTIONS says which answer the variant must give), on this
// thread and on a new one, and the C API says the same.
TEST(SectionsStatus, IsWhatTheStructuresGetInThisMode) {
  const sections status = sections_status();
  std::printf("sections: %s (owner=%s backend=%s)\n", to_string(status),
              to_string(rseq_ownership()), to_string(backend()));
  EXPECT_EQ(status == sections::on, internal::rseq_area_for_sections() != nullptr)
      << to_string(status);
  EXPECT_EQ(status == sections::on, internal::registered_rseq_area() != nullptr)
      << to_string(status);
  if (const char* want = std::getenv("PERCPU_EXPECT_SECTIONS")) {
    sections thread_reason = sections::on;
    ASSERT_TRUE(test::parse_sections(want, &thread_reason)) << want;
    EXPECT_STREQ(to_string(status), to_string(test::expected_sections(thread_reason)));
  }
  EXPECT_EQ(static_cast<int>(percpu_sections_status()), static_cast<int>(status));
  EXPECT_STREQ(percpu_sections_name(percpu_sections_status()), to_string(status));
  EXPECT_STREQ(percpu_rseq_owner_name(), to_string(rseq_ownership()));
  EXPECT_STREQ(percpu_backend_name(), to_string(backend()));
  sections in_new_thread = sections::starting;
  bool new_thread_gets_area = false;
  std::thread([&] {
    in_new_thread = sections_status();
    new_thread_gets_area = internal::rseq_area_for_sections() != nullptr;
  }).join();
  EXPECT_EQ(in_new_thread == sections::on, new_thread_gets_area) << to_string(in_new_thread);
  EXPECT_EQ(in_new_thread, status) << "every thread of this variant is in the same mode";
}

TEST(SectionsStatus, NamesEveryAnswer) {
  const struct {
    sections value;
    enum percpu_sections c_value;
    const char* name;
  } answers[] = {
      {sections::on, PERCPU_SECTIONS_ON, "on"},
      {sections::no_rseq, PERCPU_SECTIONS_NO_RSEQ, "no_rseq"},
      {sections::foreign_signature, PERCPU_SECTIONS_FOREIGN_SIGNATURE, "foreign_signature"},
      {sections::kernel_quirk, PERCPU_SECTIONS_KERNEL_QUIRK, "kernel_quirk"},
      {sections::disabled_by_environment, PERCPU_SECTIONS_DISABLED_BY_ENVIRONMENT,
       "disabled_by_environment"},
      {sections::unsupported_arch, PERCPU_SECTIONS_UNSUPPORTED_ARCH, "unsupported_arch"},
      {sections::fallback_forced, PERCPU_SECTIONS_FALLBACK_FORCED, "fallback_forced"},
      {sections::starting, PERCPU_SECTIONS_STARTING, "starting"},
  };
  for (const auto& a : answers) {
    EXPECT_STREQ(to_string(a.value), a.name);
    EXPECT_STREQ(percpu_sections_name(a.c_value), a.name);
  }
  EXPECT_STREQ(percpu_sections_name(static_cast<enum percpu_sections>(99)), "unknown");
  EXPECT_STREQ(percpu_sections_name(static_cast<enum percpu_sections>(-1)), "unknown");
}

// Fastest correct first: the order cpu.hpp promises. Runs in every variant
// where PERCPU_BACKEND is unset, the .fallback and .seccomp_eperm variants
// included, where the choice is what serves every call.
TEST(CpuMode, UnforcedFallbackIsTheFastestThatWorksHere) {
  if (const char* forced = std::getenv("PERCPU_BACKEND")) {
    GTEST_SKIP() << "PERCPU_BACKEND=" << forced << " chooses the fallback in this variant";
  }
  const cpu_backend want = expected_unforced_fallback();
  std::printf("unforced fallback: %s, expected %s\n", to_string(g_fallback_at_start),
              to_string(want));
  EXPECT_STREQ(to_string(g_fallback_at_start), to_string(want));
  if (backend() != cpu_backend::rseq) {
    EXPECT_STREQ(to_string(backend()), to_string(want)) << "the fallback serves this thread";
  }
}

// percpu's own registration is as long as the kernel's feature size (at
// least 32 bytes), as glibc 2.41+ registers: the V2 mode on Linux 7.0+.
TEST(CpuRegistration, OwnLengthFollowsTheFeatureSize) {
  using internal::own_registration_length_for;
  EXPECT_EQ(own_registration_length_for(0, 0), 32u) << "before Linux 6.3: no auxv entries";
  EXPECT_EQ(own_registration_length_for(28, 32), 32u) << "Linux 6.3 to 6.19";
  EXPECT_EQ(own_registration_length_for(33, 64), 33u) << "Linux 7.x: V2";
  EXPECT_EQ(own_registration_length_for(64, 64), 64u) << "a future feature size that still fits";
  EXPECT_EQ(own_registration_length_for(65, 128), 32u) << "more than the static area holds";
  EXPECT_EQ(own_registration_length_for(40, 128), 32u) << "an alignment the area lacks";
}

// Start-up reads PERCPU_* from the kernel's environment block when environ
// is not set up yet; the scanner must find a variable at any position, in
// pieces of any size, and never take a longer name or a value for a name.
std::string scan_environment_block(const std::string& block, const char* name, std::size_t piece,
                                   std::size_t size = 16) {
  std::vector<char> buffer(size);
  internal::environ_scanner scanner(name, buffer.data(), buffer.size());
  for (std::size_t at = 0; at < block.size(); at += piece) {
    if (!scanner.feed(block.data() + at, std::min(piece, block.size() - at))) break;
  }
  const char* value = scanner.value();
  return value != nullptr ? std::string(value) : std::string("(unset)");
}

TEST(StartupEnvironment, FindsAVariableInAnEnvironmentBlock) {
  const char raw[] =
      "HOME=/root\0PERCPU_BACKENDS=x\0X=PERCPU_BACKEND=no\0PERCPU_BACKEND=vdso\0"
      "PATH=/bin";
  const std::string block(raw, sizeof(raw));
  for (std::size_t piece : {1u, 3u, 7u, 512u}) {
    EXPECT_EQ(scan_environment_block(block, "PERCPU_BACKEND", piece), "vdso") << piece;
    EXPECT_EQ(scan_environment_block(block, "PATH", piece), "/bin") << piece;
    EXPECT_EQ(scan_environment_block(block, "HOME", piece), "/root") << piece;
    EXPECT_EQ(scan_environment_block(block, "PERCPU_RSEQ_SECTIONS", piece), "(unset)") << piece;
    EXPECT_EQ(scan_environment_block(block, "PERCPU", piece), "(unset)") << piece;
  }
  EXPECT_EQ(scan_environment_block(block, "PERCPU_BACKEND", 5, 3), "vd") << "cut to the buffer";
  EXPECT_EQ(scan_environment_block(std::string("A=1", 3), "A", 2), "1") << "no final NUL";
  EXPECT_EQ(scan_environment_block(std::string(), "A", 1), "(unset)");
}

TEST(CpuRegistration, LengthMatchesTheMode) {
  const unsigned length = internal::rseq_registration_length();
  if (backend() != cpu_backend::rseq) {
    EXPECT_EQ(length, 0u);
    GTEST_SKIP() << "no rseq registration for this thread";
  }
  const unsigned long feature = getauxval(internal::kAtRseqFeatureSize);
  const unsigned long align = getauxval(internal::kAtRseqAlign);
  if (rseq_ownership() == rseq_owner::percpu) {
    EXPECT_EQ(length, internal::own_registration_length_for(feature, align));
    if (feature > 32 && align <= 64) {
      EXPECT_GT(length, 32u) << "own threads must be V2 on 7.x";
    }
    // The kernel checks the alignment itself; this pins the promise.
    const auto* area = internal::registered_rseq_area();
    if (area != nullptr) {
      EXPECT_EQ(reinterpret_cast<std::uintptr_t>(area) % 64, 0u);
    }
  } else {
    // glibc registers max(__rseq_size, 32) bytes: 32 up to 2.40 and on
    // kernels before 7.0, the feature size from 2.41 on 7.x.
    EXPECT_GE(length, 32u);
    EXPECT_TRUE(length == 32 || length == feature) << length;
  }
  // Another thread asks for its own.
  unsigned other = 0;
  std::thread([&] { other = internal::rseq_registration_length(); }).join();
  EXPECT_EQ(other, length);
}

// Each fallback is usable exactly where the host offers it (worked out by
// tests/support/expected_backend.hpp), and an unusable one says why: no test
// assumes RDPID, or a vDSO getcpu (valgrind and qemu-user have none that
// works), only the system call, which Linux always has.
TEST(CpuMode, EachFallbackUsableExactlyWhereTheHostOffersIt) {
  for (cpu_backend b : {cpu_backend::rdpid, cpu_backend::vdso, cpu_backend::syscall}) {
    const char* why = nullptr;
    const bool usable = internal::fallback_usable(b, &why);
    const bool offered = test::host_offers(b);
    std::printf("%s: %s\n", to_string(b),
                offered ? "offered by this host, checked usable"
                        : (std::string("not offered (") + test::why_not_offered(b) +
                           "), checked unusable with a reason")
                              .c_str());
    EXPECT_EQ(usable, offered) << to_string(b) << (why != nullptr ? std::string(": ") + why : "");
    EXPECT_EQ(why == nullptr, usable) << to_string(b);
  }
  EXPECT_TRUE(internal::fallback_usable(cpu_backend::syscall, nullptr));
#if !defined(__x86_64__)
  EXPECT_FALSE(internal::fallback_usable(cpu_backend::rdpid, nullptr));
#endif
}

TEST(CpuMode, MaxCpusCoversEveryAllowedCpu) {
  const std::vector<int> cpus = allowed_cpus();
  ASSERT_FALSE(cpus.empty());
  EXPECT_GT(max_cpus(), cpus.back());
  EXPECT_EQ(percpu_max_cpus(), max_cpus());
  EXPECT_GE(max_cpus(), static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN)));
}

TEST_F(BackendTest, EveryBackendAgreesWithGetcpuOnEveryCpu) {
  const std::vector<cpu_backend> backends = usable_backends();
  ASSERT_FALSE(backends.empty());
  for (cpu_backend b : backends) {
    ASSERT_TRUE(internal::force_backend(b)) << to_string(b);
    EXPECT_EQ(backend(), b);
    EXPECT_STREQ(percpu_backend_name(), to_string(b));
    for (int cpu : allowed_cpus()) {
      pin_to pin(cpu);
      ASSERT_TRUE(pin.ok());
      for (int i = 0; i < 100; ++i) {
        const std::string error = check_pinned(cpu);
        ASSERT_EQ(error, "") << "backend " << to_string(b);
      }
    }
    std::printf("checked backend %s on %zu CPUs\n", to_string(b), allowed_cpus().size());
  }
}

TEST_F(BackendTest, ManyThreadsCreatedAfterFirstUse) {
  (void)cpu_id();  // first use happens before the threads exist
  const std::vector<int> cpus = allowed_cpus();
  for (cpu_backend b : usable_backends()) {
    ASSERT_TRUE(internal::force_backend(b));
    std::atomic<int> failures{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 16; ++t) {
      threads.emplace_back([&, t] {
        const int cpu = cpus[t % cpus.size()];
        pin_to pin(cpu);
        if (!pin.ok()) {
          failures++;
          return;
        }
        for (int i = 0; i < 2000; ++i) {
          if (!check_pinned(cpu).empty()) failures++;
        }
        if (backend() != b) failures++;
      });
    }
    for (auto& t : threads) t.join();
    EXPECT_EQ(failures.load(), 0) << "backend " << to_string(b);
  }
}

TEST_F(BackendTest, ThreadsStartedBeforeFirstUseAgree) {
  // These threads exist before the calls below; own-registration mode must
  // register each lazily on its own first call.
  const std::vector<int> cpus = allowed_cpus();
  std::atomic<bool> go{false};
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      while (!go.load()) std::this_thread::yield();
      const int cpu = cpus[t % cpus.size()];
      pin_to pin(cpu);
      for (int i = 0; i < 1000; ++i) {
        if (!check_pinned(cpu).empty()) failures++;
      }
    });
  }
  go = true;
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
}

std::atomic<int> g_signal_cpu{-2};
std::atomic<int> g_signal_kernel_cpu{-3};
std::atomic<int> g_signal_errno_changed{0};

void record_cpu_in_handler(int) {
  errno = 12345;
  g_signal_cpu = cpu_id();
  g_signal_errno_changed = errno != 12345;
  unsigned cpu = 0;
  internal::raw_syscall_getcpu(&cpu, nullptr);
  g_signal_kernel_cpu = static_cast<int>(cpu);
}

TEST_F(BackendTest, FromASignalHandler) {
  struct sigaction action {};
  action.sa_handler = record_cpu_in_handler;
  sigemptyset(&action.sa_mask);
  ASSERT_EQ(sigaction(SIGUSR1, &action, nullptr), 0);
  for (cpu_backend b : usable_backends()) {
    ASSERT_TRUE(internal::force_backend(b));
    for (int cpu : allowed_cpus()) {
      // A fresh thread, so its very first call (and own registration) happens
      // inside the handler.
      std::thread([&] {
        pin_to pin(cpu);
        g_signal_cpu = -2;
        pthread_kill(pthread_self(), SIGUSR1);
        EXPECT_EQ(g_signal_cpu.load(), cpu) << to_string(b);
        EXPECT_EQ(g_signal_kernel_cpu.load(), cpu);
        EXPECT_EQ(g_signal_errno_changed.load(), 0);
        EXPECT_EQ(check_pinned(cpu), "");
      }).join();
    }
  }
  signal(SIGUSR1, SIG_DFL);
}

TEST_F(BackendTest, InAForkedChild) {
  for (cpu_backend b : usable_backends()) {
    ASSERT_TRUE(internal::force_backend(b));
    (void)cpu_id();
    const pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      int bad = 0;
      for (int cpu : allowed_cpus()) {
        pin_to pin(cpu);
        for (int i = 0; i < 200; ++i) bad += !check_pinned(cpu).empty();
      }
      // A thread started in the child works too.
      std::thread([&] {
        for (int cpu : allowed_cpus()) {
          pin_to pin(cpu);
          bad += !check_pinned(cpu).empty();
        }
      }).join();
      if (backend() != b) bad++;
      _exit(bad == 0 ? 0 : 1);
    }
    int status = 0;
    ASSERT_EQ(waitpid(child, &status, 0), child);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "backend " << to_string(b);
  }
}

// ---- concurrency_id() ---------------------------------------------------------

bool mm_cid_served() {
  return internal::registered_rseq_area() != nullptr &&
         rseq_feature_size() >= internal::kFeatureSizeMmCid;
}

// concurrency_id_source() names what concurrency_id() reads: mm_cid exactly
// where the kernel keeps it for this thread's area, the CPU id elsewhere.
TEST(ConcurrencyId, TheSourceSaysWhichFieldIsRead) {
  const concurrency_source source = concurrency_id_source();
  EXPECT_EQ(source,
            backend() == cpu_backend::rseq && rseq_feature_size() >= internal::kFeatureSizeMmCid
                ? concurrency_source::mm_cid
                : concurrency_source::cpu_id);
  EXPECT_STREQ(to_string(source), source == concurrency_source::mm_cid ? "mm_cid" : "cpu_id");
  if (source == concurrency_source::mm_cid) {
    EXPECT_EQ(internal::g_fast_path.concurrency_id - internal::g_fast_path.area,
              static_cast<std::intptr_t>(internal::kMmCidOffset));
  }
}

// The area's mm_cid, read the way the kernel writes it.
int area_mm_cid() {
  return __atomic_load_n(&internal::registered_rseq_area()->mm_cid, __ATOMIC_RELAXED);
}

// Where the kernel keeps mm_cid, concurrency_id() is that field: on two
// threads pinned to two CPUs at once (so they need two ids, and one of them
// is not 0) every answer equals the field read right before and after it.
TEST(ConcurrencyId, IsTheAreasMmCid) {
  if (!mm_cid_served()) {
    GTEST_SKIP() << "no mm_cid here (rseq " << to_string(backend()) << ", feature size "
                 << rseq_feature_size() << "): ConcurrencyId.IsCpuIdWithoutMmCid covers it";
  }
  // The inline path must read the mm_cid word of the area it serves from.
  EXPECT_EQ(internal::g_fast_path.concurrency_id - internal::g_fast_path.area,
            static_cast<std::intptr_t>(internal::kMmCidOffset));
  const std::vector<int> cpus = allowed_cpus();
  const int threads = cpus.size() >= 2 ? 2 : 1;
  std::atomic<int> ready{0}, mismatches{0}, not_zero{0};
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      pin_to pin(cpus[t]);
      ready++;
      while (ready.load() < threads) {
      }
      for (int i = 0; i < 20000; ++i) {
        const int before = area_mm_cid();
        const int got = concurrency_id();
        const int after = area_mm_cid();
        if (before != after) continue;  // the kernel handed out another id in between
        if (got != before) {
          if (mismatches++ == 0) {
            ADD_FAILURE() << "concurrency_id() " << got << " where the area's mm_cid is " << before;
          }
        }
        if (before != 0) not_zero++;
        if (got < 0 || got >= max_cpus()) mismatches++;
      }
    });
  }
  for (std::thread& w : workers) w.join();
  std::printf("%d samples with a non-zero mm_cid\n", not_zero.load());
  EXPECT_EQ(mismatches.load(), 0);
}

// A process with one thread needs one id: mm_cid is 0 there, and so is
// concurrency_id(). Checked in a forked child, which has only the thread
// that forked.
TEST(ConcurrencyId, IsZeroInASingleThreadedChild) {
  if (!mm_cid_served()) {
    GTEST_SKIP() << "no mm_cid here (rseq " << to_string(backend()) << ", feature size "
                 << rseq_feature_size() << "): ConcurrencyId.IsCpuIdWithoutMmCid covers it";
  }
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    int bad = 0;
    for (int cpu : allowed_cpus()) {
      pin_to pin(cpu);
      for (int i = 0; i < 100; ++i) {
        if (concurrency_id() != 0 || area_mm_cid() != 0) bad++;
      }
    }
    _exit(bad == 0 ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << "concurrency_id() or mm_cid not 0 in a single-threaded process";
}

// Where mm_cid is missing (no rseq on this thread, or a kernel before 6.3),
// concurrency_id() is cpu_id(): checked pinned to every allowed CPU.
TEST(ConcurrencyId, IsCpuIdWithoutMmCid) {
  if (mm_cid_served()) {
    GTEST_SKIP() << "the kernel provides mm_cid here: ConcurrencyId.IsTheAreasMmCid covers it";
  }
  for (int cpu : allowed_cpus()) {
    pin_to pin(cpu);
    ASSERT_TRUE(pin.ok());
    for (int i = 0; i < 100; ++i) {
      ASSERT_EQ(ask_kernel().cpu, cpu);
      ASSERT_EQ(concurrency_id(), cpu) << "backend " << to_string(backend());
    }
  }
}

TEST(CpuErrno, UnchangedBySuccessfulCalls) {
  errno = 777;
  (void)cpu_id();
  (void)node_id();
  (void)concurrency_id();
  (void)percpu_sched_getcpu();
  (void)backend();
  EXPECT_EQ(errno, 777);
}

// The probes below compare percpu's answer with the kernel's before main.
// Two reads bracketing it cannot tell a wrong answer from a migration: the
// thread may go from CPU a to b and back to a between them (seen in CI under
// qemu-user on a loaded 2-CPU host, where the first call's set-up is long).
// So each comparison is made pinned, where no migration can fall between
// the reads, on every allowed CPU in turn, and the old mask is restored.
// No allocation: it also runs from .preinit_array.
struct pinned_agreement {
  int cpus_checked = 0;
  int wrong_on = -1, wrong_answer = -1;  // the first disagreement, if any
};
template <typename Read>
pinned_agreement agree_pinned(Read read) {
  pinned_agreement result;
  cpu_set_t old;
  CPU_ZERO(&old);
  if (sched_getaffinity(0, sizeof(old), &old) != 0) return result;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (!CPU_ISSET(c, &old)) continue;
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(c, &one);
    // The kernel moves the thread before this returns when c is not the
    // CPU it runs on.
    if (sched_setaffinity(0, sizeof(one), &one) != 0) continue;
    unsigned kernel = 0;
    internal::raw_syscall_getcpu(&kernel, nullptr);
    const int seen = read();
    ++result.cpus_checked;
    if (seen != static_cast<int>(kernel) && result.wrong_on < 0) {
      result.wrong_on = static_cast<int>(kernel);
      result.wrong_answer = seen;
    }
  }
  sched_setaffinity(0, sizeof(old), &old);
  return result;
}

void expect_agreement(const pinned_agreement& a, const char* what) {
  EXPECT_GT(a.cpus_checked, 0) << what << ": could not pin to any allowed CPU";
  EXPECT_EQ(a.wrong_on, -1) << what << " answered " << a.wrong_answer << " pinned to CPU "
                            << a.wrong_on;
}

// A static constructor in another translation unit runs after percpu's
// (priority 101) and may already use it.
struct static_probe {
  pinned_agreement cpu_id_agrees;
  static_probe() {
    cpu_id_agrees = agree_pinned([] { return cpu_id(); });
  }
};
static_probe g_static_probe;

// Runs from .preinit_array: before every constructor, percpu's included.
// Only the out-of-line C API promises to work this early. The first calls
// set percpu up, unpinned, as a program's would; then both must agree with
// the kernel on every CPU.
struct preinit_probe {
  int first_sched_getcpu = -1, first_cpu_id = -1;
  pinned_agreement sched_getcpu_agrees, cpu_id_agrees;
};
preinit_probe g_preinit;
void run_preinit_probe(int, char**, char**) {
  g_preinit.first_sched_getcpu = percpu_sched_getcpu();
  g_preinit.first_cpu_id = percpu_cpu_id();
  g_preinit.sched_getcpu_agrees = agree_pinned([] { return percpu_sched_getcpu(); });
  g_preinit.cpu_id_agrees = agree_pinned([] { return percpu_cpu_id(); });
}
__attribute__((section(".preinit_array"),
               used)) void (*const g_preinit_entry)(int, char**, char**) = run_preinit_probe;

TEST(CpuStatic, CApiWorksBeforeAnyConstructor) {
  EXPECT_GE(g_preinit.first_sched_getcpu, 0);
  EXPECT_LT(g_preinit.first_sched_getcpu, max_cpus());
  EXPECT_GE(g_preinit.first_cpu_id, 0);
  EXPECT_LT(g_preinit.first_cpu_id, max_cpus());
  expect_agreement(g_preinit.sched_getcpu_agrees, "percpu_sched_getcpu() before constructors");
  expect_agreement(g_preinit.cpu_id_agrees, "percpu_cpu_id() before constructors");
}

TEST(CpuStatic, WorksInStaticConstructorsBeforeMain) {
  expect_agreement(g_static_probe.cpu_id_agrees, "cpu_id() in a static constructor");
}

TEST(CpuExec, WorksAfterExec) {
  // Re-runs this test binary (by the name it was started with: under
  // valgrind /proc/self/exe is the tool) with a filter for one test, so the
  // whole start-up path runs again in a fresh image.
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    execl(program_invocation_name, program_invocation_name,
          "--gtest_filter=BackendTest.EveryBackendAgreesWithGetcpuOnEveryCpu",
          static_cast<char*>(nullptr));
    _exit(127);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

// Runs this test binary again (as CpuExec does) with `env` changed (NAME=VALUE
// sets, a bare NAME unsets) and one gtest filter; returns its exit status and what it wrote to stdout and
// stderr, interleaved.
struct child_run {
  int status = -1;
  std::string output;
};
child_run run_self(const char* filter, const std::vector<std::string>& env) {
  child_run r;
  int fds[2];
  if (pipe(fds) != 0) return r;
  const pid_t child = fork();
  if (child == 0) {
    dup2(fds[1], 1);
    dup2(fds[1], 2);
    close(fds[0]);
    close(fds[1]);
    for (const std::string& e : env) {
      if (e.find('=') == std::string::npos) {
        unsetenv(e.c_str());
      } else {
        putenv(const_cast<char*>(e.c_str()));
      }
    }
    const std::string arg = std::string("--gtest_filter=") + filter;
    execl(program_invocation_name, program_invocation_name, arg.c_str(),
          static_cast<char*>(nullptr));
    _exit(127);
  }
  close(fds[1]);
  char buffer[4096];
  ssize_t n;
  while ((n = read(fds[0], buffer, sizeof(buffer))) > 0) r.output.append(buffer, n);
  close(fds[0]);
  if (child > 0) waitpid(child, &r.status, 0);
  return r;
}

// PERCPU_BACKEND names a fallback: the child serves from it where the host
// offers it and says nothing; where the host does not (RDPID on a CPU
// without it, the vDSO under valgrind), it serves from the next one the host
// offers and says so on stderr, naming both. The child checks which backend
// serves (PERCPU_EXPECT_BACKEND=forced); here, that its message matches.
// A forced fallback is every thread's source, so the owner and registration
// error the variant expects do not hold for the child.
TEST(ForcedBackend, AnUnofferedChoiceFallsToTheNextAndSaysSo) {
  for (const char* forced : {"rdpid", "vdso", "syscall"}) {
    SCOPED_TRACE(forced);
    const child_run r = run_self("CpuMode.PrintedAndAsExpected",
                                 {std::string("PERCPU_BACKEND=") + forced,
                                  "PERCPU_EXPECT_BACKEND=forced", "PERCPU_EXPECT_OWNER",
                                  "PERCPU_EXPECT_RSEQ_ERROR"});
    ASSERT_TRUE(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 0) << r.output;
    const std::string marker = "checked backend ";
    const std::size_t at = r.output.find(marker);
    ASSERT_NE(at, std::string::npos) << r.output;
    const std::string chosen =
        r.output.substr(at + marker.size(), r.output.find(':', at) - at - marker.size());
    const std::string message = std::string("PERCPU_BACKEND=") + forced + " is unavailable here (";
    const std::size_t said = r.output.find(message);
    std::printf("PERCPU_BACKEND=%s: served by %s, %s\n", forced, chosen.c_str(),
                chosen == forced ? "checked no message" : "checked the message");
    if (chosen == forced) {
      EXPECT_EQ(said, std::string::npos) << r.output;
    } else {
      ASSERT_NE(said, std::string::npos) << r.output;
      EXPECT_NE(r.output.find("); using " + chosen, said), std::string::npos) << r.output;
    }
  }
}

// A registration that fails on one thread is that thread's fact: threads
// created afterwards still register, and the process keeps reporting
// percpu as the owner to them.
TEST(CpuPerThread, OneThreadDeniedRseqLeavesTheOthersOnRseq) {
  (void)cpu_id();
  if (rseq_ownership() != rseq_owner::percpu) {
    GTEST_SKIP() << "needs percpu's own registration (the .own variant)";
  }
  for (int error : {ENOSYS, EPERM}) {
    std::thread denied([error] {
      ASSERT_TRUE(tools::deny_rseq(error));  // binds this thread only
      EXPECT_GE(cpu_id(), 0);
      EXPECT_NE(backend(), cpu_backend::rseq);
      EXPECT_EQ(rseq_ownership(), rseq_owner::none) << "as seen from the denied thread";
      EXPECT_STREQ(to_string(sections_status()),
                   to_string(test::expected_sections(sections::no_rseq)));
    });
    denied.join();
    std::thread later([] {
      EXPECT_EQ(backend(), cpu_backend::rseq) << "a later thread must still register";
      EXPECT_EQ(rseq_ownership(), rseq_owner::percpu);
      EXPECT_EQ(internal::rseq_registration_error(), 0);
      EXPECT_STREQ(to_string(sections_status()), to_string(test::expected_sections(sections::on)));
    });
    later.join();
  }
  EXPECT_EQ(backend(), cpu_backend::rseq);
}

}  // namespace
}  // namespace percpu
