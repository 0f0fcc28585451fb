// Tests for the rseq critical-section layer (percpu/internal/rseq_cs.hpp).
//
// Single-threaded paths run twice: on a private, never-registered area (the
// kernel never aborts it, so commit, compare-fail and index-mismatch outcomes
// are deterministic in every mode, fallback included) and on the thread's
// real area where rseq serves it. Contention tests need the kernel: 12
// threads on 2 CPUs, migrated every few hundred microseconds, with timer
// signals whose handlers run sections too, and exact results at the end.

#include "percpu/internal/rseq_cs.hpp"

#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "percpu/cpu.hpp"
#include "tests/stress/stress.hpp"

namespace percpu {
namespace internal {
namespace {

static_assert(sizeof(rseq_cs_descriptor) == 32 && alignof(rseq_cs_descriptor) == 32,
              "struct rseq_cs ABI");
static_assert(index_offset<index_kind::cpu_id>() == offsetof(rseq_area, cpu_id), "cpu_id");
static_assert(index_offset<index_kind::mm_cid>() == offsetof(rseq_area, mm_cid), "mm_cid");

namespace stress = percpu::stress;

// Whether this thread's sections run on rseq: it has rseq, and sections are
// not switched off (rseq_sections_enabled()).
bool rseq_served() { return backend() == cpu_backend::rseq && rseq_sections_enabled(); }

// Checks the descriptor a section left armed in area->rseq_cs: the same
// properties the kernel checks when it aborts the section.
void expect_armed_descriptor_valid(const rseq_area& area) {
  ASSERT_NE(area.rseq_cs, 0u) << "the section did not arm its descriptor";
  const auto* cs = reinterpret_cast<const rseq_cs_descriptor*>(area.rseq_cs);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(cs) % 32, 0u);
  EXPECT_EQ(cs->version, 0u);
  EXPECT_EQ(cs->flags, 0u);
  EXPECT_GT(cs->post_commit_offset, 0u);
  EXPECT_FALSE(cs->abort_ip >= cs->start_ip && cs->abort_ip < cs->start_ip + cs->post_commit_offset)
      << "abort_ip inside the section";
  std::uint32_t signature = 0;
  std::memcpy(&signature, reinterpret_cast<const void*>(cs->abort_ip - 4), sizeof(signature));
  EXPECT_EQ(signature, kRseqSignature);
}

// A private area: the kernel never sees it, so it never aborts these runs.
template <index_kind K>
rseq_area fake_area(int index) {
  rseq_area area{};
  area.cpu_id = K == index_kind::cpu_id ? index : 1000;
  area.mm_cid = K == index_kind::mm_cid ? index : 2000;
  return area;
}

template <index_kind K>
void run_single_threaded_paths(rseq_area* area, int index, bool deterministic) {
  // On a real area a preemption between reading the index and the section
  // may abort a run; retry those, the outcome must still be the same.
  auto retry = [&](auto op) {
    for (int tries = 0;; ++tries) {
      const int rc = op();
      if (rc != -1 || deterministic || tries > 1000) return rc;
      index = rseq_current_index<K>(area);
    }
  };
  std::intptr_t v = 5;
  EXPECT_EQ(retry([&] { return rseq_addv<K>(area, &v, 3, index); }), 0);
  EXPECT_EQ(v, 8);
  EXPECT_EQ(retry([&] { return rseq_addv<K>(area, &v, -10, index); }), 0);
  EXPECT_EQ(v, -2);
  expect_armed_descriptor_valid(*area);

  EXPECT_EQ(retry([&] { return rseq_cmpeqv_storev<K>(area, &v, -2, 40, index); }), 0);
  EXPECT_EQ(v, 40);
  EXPECT_EQ(retry([&] { return rseq_cmpeqv_storev<K>(area, &v, 39, 50, index); }), 1);
  EXPECT_EQ(v, 40);
  expect_armed_descriptor_valid(*area);

  std::intptr_t v2 = 0;
  EXPECT_EQ(retry([&] { return rseq_cmpeqv_trystorev_storev<K>(area, &v, 40, &v2, 7, 41, index); }),
            0);
  EXPECT_EQ(v, 41);
  EXPECT_EQ(v2, 7);
  EXPECT_EQ(retry([&] { return rseq_cmpeqv_trystorev_storev<K>(area, &v, 40, &v2, 9, 42, index); }),
            1);
  EXPECT_EQ(v, 41);
  EXPECT_EQ(v2, 7) << "a failed comparison must not make the speculative store";
  expect_armed_descriptor_valid(*area);

  struct node {
    std::intptr_t payload;
    std::intptr_t next;
  };
  node second{2, 0};
  node first{1, reinterpret_cast<std::intptr_t>(&second)};
  std::intptr_t head = reinterpret_cast<std::intptr_t>(&first);
  std::intptr_t popped = 0;
  const long next_offset = static_cast<long>(offsetof(node, next));
  EXPECT_EQ(retry([&] {
              return rseq_cmpabovev_storeoffp_load<K>(area, &head, 1, next_offset, &popped, index);
            }),
            0);
  EXPECT_EQ(popped, reinterpret_cast<std::intptr_t>(&first));
  EXPECT_EQ(head, reinterpret_cast<std::intptr_t>(&second));
  EXPECT_EQ(retry([&] {
              return rseq_cmpabovev_storeoffp_load<K>(area, &head, 1, next_offset, &popped, index);
            }),
            0);
  EXPECT_EQ(popped, reinterpret_cast<std::intptr_t>(&second));
  EXPECT_EQ(head, 0);
  popped = 99;
  EXPECT_EQ(retry([&] {
              return rseq_cmpabovev_storeoffp_load<K>(area, &head, 1, next_offset, &popped, index);
            }),
            1);
  EXPECT_EQ(head, 0);
  EXPECT_EQ(popped, 99) << "popping an empty list must not write *load";
  // Every value up to the floor is a marker, refused as the empty list is
  // (a locked slot holds 1): never followed as a node.
  head = 1;
  EXPECT_EQ(retry([&] {
              return rseq_cmpabovev_storeoffp_load<K>(area, &head, 1, next_offset, &popped, index);
            }),
            1);
  EXPECT_EQ(head, 1);
  EXPECT_EQ(popped, 99) << "a marker must not be popped";
  expect_armed_descriptor_valid(*area);

  // The push: the head read in the section links the chain's last node.
  head = 0;
  second.next = 77;
  EXPECT_EQ(retry([&] {
              return rseq_cmpnev_trystorev_storev<K>(
                  area, &head, 1, &second.next, reinterpret_cast<std::intptr_t>(&second), index);
            }),
            0);
  EXPECT_EQ(head, reinterpret_cast<std::intptr_t>(&second));
  EXPECT_EQ(second.next, 0) << "the empty list's head must link the pushed node";
  EXPECT_EQ(retry([&] {
              return rseq_cmpnev_trystorev_storev<K>(
                  area, &head, 1, &first.next, reinterpret_cast<std::intptr_t>(&first), index);
            }),
            0);
  EXPECT_EQ(head, reinterpret_cast<std::intptr_t>(&first));
  EXPECT_EQ(first.next, reinterpret_cast<std::intptr_t>(&second));
  head = 1;
  first.next = 55;
  EXPECT_EQ(retry([&] {
              return rseq_cmpnev_trystorev_storev<K>(
                  area, &head, 1, &first.next, reinterpret_cast<std::intptr_t>(&first), index);
            }),
            1);
  EXPECT_EQ(head, 1) << "a push onto a locked slot must not commit";
  EXPECT_EQ(first.next, 55) << "a refused push must not write the link";
  expect_armed_descriptor_valid(*area);
}

// A wrong index must abort every operation before any store.
template <index_kind K>
void run_index_mismatch(rseq_area* area, int wrong) {
  std::intptr_t v = 5, v2 = 6, load = 7;
  std::intptr_t node[2] = {0, 0};
  std::intptr_t head = reinterpret_cast<std::intptr_t>(node);
  EXPECT_EQ((rseq_addv<K>(area, &v, 1, wrong)), -1);
  EXPECT_EQ((rseq_cmpeqv_storev<K>(area, &v, 5, 9, wrong)), -1);
  EXPECT_EQ((rseq_cmpeqv_trystorev_storev<K>(area, &v, 5, &v2, 1, 9, wrong)), -1);
  EXPECT_EQ((rseq_cmpabovev_storeoffp_load<K>(area, &head, 1, 0, &load, wrong)), -1);
  EXPECT_EQ((rseq_cmpnev_trystorev_storev<K>(area, &head, 1, &v2, 9, wrong)), -1);
  EXPECT_EQ(v, 5);
  EXPECT_EQ(v2, 6);
  EXPECT_EQ(load, 7);
  EXPECT_EQ(head, reinterpret_cast<std::intptr_t>(node));
}

TEST(RseqCsTest, PrivateAreaCpuIdPaths) {
  rseq_area area = fake_area<index_kind::cpu_id>(3);
  run_single_threaded_paths<index_kind::cpu_id>(&area, 3, true);
  run_index_mismatch<index_kind::cpu_id>(&area, 4);
  EXPECT_EQ(area.cpu_id, 3) << "sections must never write the index fields";
  EXPECT_EQ(area.mm_cid, 2000);
}

TEST(RseqCsTest, PrivateAreaMmCidPaths) {
  rseq_area area = fake_area<index_kind::mm_cid>(1);
  run_single_threaded_paths<index_kind::mm_cid>(&area, 1, true);
  run_index_mismatch<index_kind::mm_cid>(&area, 0);
  // The cpu_id field is 1000 here: an mm_cid section must not look at it.
  EXPECT_EQ(area.cpu_id, 1000);
  EXPECT_EQ(area.mm_cid, 1);
}

TEST(RseqCsTest, AreaForSectionsMatchesBackend) {
  rseq_area* area = rseq_area_for_sections();
  if (rseq_served()) {
    ASSERT_NE(area, nullptr);
    EXPECT_GE(rseq_current_index<index_kind::cpu_id>(area), 0);
    EXPECT_LT(rseq_current_index<index_kind::cpu_id>(area), max_cpus());
  } else {
    EXPECT_EQ(area, nullptr) << "without rseq, callers must be sent to their atomic path";
  }
}

TEST(RseqCsTest, RegisteredAreaPaths) {
  rseq_area* area = rseq_area_for_sections();
  if (area == nullptr) {
    EXPECT_FALSE(rseq_served());
    GTEST_SKIP() << "no registered rseq area on this thread (backend " << to_string(backend())
                 << "): the private-area tests cover the sections here";
  }
  run_single_threaded_paths<index_kind::cpu_id>(area, rseq_current_index<index_kind::cpu_id>(area),
                                                false);
  const int cpu = rseq_current_index<index_kind::cpu_id>(area);
  run_index_mismatch<index_kind::cpu_id>(area, cpu + max_cpus());
  run_index_mismatch<index_kind::cpu_id>(area, -1);
  if (index_kind_usable(index_kind::mm_cid)) {
    run_single_threaded_paths<index_kind::mm_cid>(
        area, rseq_current_index<index_kind::mm_cid>(area), false);
    run_index_mismatch<index_kind::mm_cid>(area, max_cpus() + 5);
  }
}

// ---- contention ------------------------------------------------------------

constexpr int kWorkers = 12;
constexpr int kSignal = SIGUSR1;

struct alignas(64) padded_word {
  std::intptr_t value = 0;
};

struct list_node {
  std::intptr_t next = 0;
  std::atomic<int> held{0};
};

// Shared between workers and their signal handlers.
struct contention_state {
  std::vector<padded_word> add_slots;
  std::vector<padded_word> cas_slots;
  std::vector<padded_word> heads;
  std::vector<list_node> nodes;
  std::atomic<long> handler_adds[kWorkers] = {};
  std::atomic<long> aborts{0};
  std::atomic<long> duplicates{0};
  std::atomic<long> handlers_without_area{0};
};
contention_state* g_state = nullptr;
thread_local int t_worker = -1;

template <index_kind K>
void add_one(contention_state* s, long* aborts) {
  rseq_area* area = rseq_area_for_sections();
  for (;;) {
    const int index = rseq_current_index<K>(area);
    if (rseq_addv<K>(area, &s->add_slots[static_cast<std::size_t>(index)].value, 1, index) == 0) {
      return;
    }
    ++*aborts;
  }
}

template <index_kind K>
void cas_increment(contention_state* s, long* aborts) {
  rseq_area* area = rseq_area_for_sections();
  for (;;) {
    const int index = rseq_current_index<K>(area);
    std::intptr_t* slot = &s->cas_slots[static_cast<std::size_t>(index)].value;
    const std::intptr_t seen = __atomic_load_n(slot, __ATOMIC_RELAXED);
    if (rseq_cmpeqv_storev<K>(area, slot, seen, seen + 1, index) == 0) return;
    ++*aborts;
  }
}

// Pops a node from the current CPU's list and pushes it back, possibly on
// another CPU's list. A node popped twice at once shows up in `held`.
template <index_kind K>
void pop_push(contention_state* s, long* aborts) {
  rseq_area* area = rseq_area_for_sections();
  const long next_offset = static_cast<long>(offsetof(list_node, next));
  std::intptr_t popped = 0;
  for (;;) {
    const int index = rseq_current_index<K>(area);
    const int rc = rseq_cmpabovev_storeoffp_load<K>(
        area, &s->heads[static_cast<std::size_t>(index)].value, 1, next_offset, &popped, index);
    if (rc == 1) return;  // this CPU's list is empty
    if (rc == 0) break;
    ++*aborts;
  }
  auto* node = reinterpret_cast<list_node*>(popped);
  if (node->held.exchange(1) != 0) s->duplicates.fetch_add(1);
  node->held.store(0);
  for (;;) {
    const int index = rseq_current_index<K>(area);
    std::intptr_t* head = &s->heads[static_cast<std::size_t>(index)].value;
    const std::intptr_t seen = __atomic_load_n(head, __ATOMIC_RELAXED);
    if (rseq_cmpeqv_trystorev_storev<K>(area, head, seen, &node->next, seen, popped, index) == 0) {
      return;
    }
    ++*aborts;
  }
}

template <index_kind K>
void on_signal(int) {
  if (g_state == nullptr || t_worker < 0) return;
  // The first signals can land while the worker registers its area (percpu
  // registers lazily in own mode); the handler must find rseq all the same.
  if (rseq_area_for_sections() == nullptr) {
    g_state->handlers_without_area.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  long aborts = 0;
  add_one<K>(g_state, &aborts);
  pop_push<K>(g_state, &aborts);
  g_state->handler_adds[t_worker].fetch_add(1, std::memory_order_relaxed);
  g_state->aborts.fetch_add(aborts, std::memory_order_relaxed);
}

template <index_kind K>
void run_contention(const char* name) {
  rseq_area* main_area = rseq_area_for_sections();
  if (main_area == nullptr) {
    EXPECT_FALSE(rseq_served());
    GTEST_SKIP() << "no registered rseq area (backend " << to_string(backend())
                 << "): no kernel restarts to race against";
  }
  const std::size_t slots = static_cast<std::size_t>(max_cpus());
  contention_state state;
  state.add_slots.resize(slots);
  state.cas_slots.resize(slots);
  state.heads.resize(slots);
  state.nodes = std::vector<list_node>(256);
  // Spread the nodes over every slot's list, so each CPU has some to pop.
  for (std::size_t i = 0; i < state.nodes.size(); ++i) {
    std::intptr_t& head = state.heads[i % slots].value;
    state.nodes[i].next = head;
    head = reinterpret_cast<std::intptr_t>(&state.nodes[i]);
  }
  g_state = &state;
  stress::install_handler(kSignal, &on_signal<K>);
#if defined(PERCPU_INJECT_DELAYS)
  // Long sections: most preemptions, migrations and signals land inside one.
  const unsigned saved_delay = g_inject_delay_loops.exchange(2000);
#endif

  const std::vector<int> cpus = stress::test_cpus(2);
  const std::vector<int> saved = stress::allowed_cpus();
  ASSERT_TRUE(stress::restrict_to(cpus));
  std::atomic<long> worker_adds{0}, worker_cas{0};
  {
    stress::worker_group workers(kWorkers, [&](int w, const stress::stop_flag& stop) {
      t_worker = w;
      stress::thread_signal_timer timer(kSignal, 10000);
      long adds = 0, cas = 0, aborts = 0;
      while (!stop) {
        add_one<K>(&state, &aborts);
        ++adds;
        cas_increment<K>(&state, &aborts);
        ++cas;
        pop_push<K>(&state, &aborts);
      }
      t_worker = -1;
      worker_adds.fetch_add(adds);
      worker_cas.fetch_add(cas);
      state.aborts.fetch_add(aborts);
    });
    stress::affinity_flipper flipper(workers, cpus, std::chrono::microseconds(300));
    stress::sleep_scaled(std::chrono::milliseconds(800));
    flipper.stop();
    workers.stop_and_join();
    std::printf("%s: %ld affinity flips\n", name, flipper.flips());
  }
  stress::restore_default(kSignal);
  g_state = nullptr;
#if defined(PERCPU_INJECT_DELAYS)
  g_inject_delay_loops.store(saved_delay);
#endif
  stress::restrict_to(saved);

  long handler_adds = 0;
  for (const auto& h : state.handler_adds) handler_adds += h.load();
  long add_sum = 0, cas_sum = 0;
  for (std::size_t i = 0; i < slots; ++i) {
    add_sum += state.add_slots[i].value;
    cas_sum += state.cas_slots[i].value;
  }
  const double seconds =
      std::chrono::duration<double>(stress::scaled(std::chrono::milliseconds(800))).count();
  std::printf(
      "%s: %ld adds by workers, %ld by signal handlers (%.0f per second), "
      "%ld compare-and-stores, %ld aborted or retried sections\n",
      name, worker_adds.load(), handler_adds, static_cast<double>(handler_adds) / seconds,
      worker_cas.load(), state.aborts.load());
  EXPECT_GT(handler_adds, 0) << "no timer signal reached a worker";
  EXPECT_EQ(state.handlers_without_area.load(), 0)
      << "a signal handler on a worker found no rseq area while rseq serves the process";
  EXPECT_EQ(add_sum, worker_adds.load() + handler_adds);
  EXPECT_EQ(cas_sum, worker_cas.load());

  // Every node is on exactly one list, once.
  std::vector<int> seen(state.nodes.size(), 0);
  std::size_t listed = 0;
  for (std::size_t i = 0; i < slots; ++i) {
    for (std::intptr_t p = state.heads[i].value; p != 0 && listed <= state.nodes.size();
         p = reinterpret_cast<list_node*>(p)->next) {
      const auto at =
          static_cast<std::size_t>(reinterpret_cast<list_node*>(p) - state.nodes.data());
      ASSERT_LT(at, state.nodes.size()) << "a list holds a pointer that is no node";
      ++seen[at];
      ++listed;
    }
  }
  EXPECT_EQ(listed, state.nodes.size()) << "nodes lost or duplicated";
  for (std::size_t i = 0; i < seen.size(); ++i) EXPECT_EQ(seen[i], 1) << "node " << i;
  EXPECT_EQ(state.duplicates.load(), 0) << "a node was popped by two threads at once";
}

TEST(RseqCsTest, ContentionCpuIdExact) { run_contention<index_kind::cpu_id>("cpu_id"); }

TEST(RseqCsTest, ContentionMmCidExact) {
  if (rseq_area_for_sections() != nullptr && !index_kind_usable(index_kind::mm_cid)) {
    // A kernel older than 6.3 has no mm_cid; index_kind_usable says so and
    // callers must pick cpu_id. This machine's CI kernel has it.
    EXPECT_LT(rseq_feature_size(), kFeatureSizeMmCid);
    GTEST_SKIP() << "this kernel keeps no mm_cid (feature size " << rseq_feature_size() << ")";
  }
  run_contention<index_kind::mm_cid>("mm_cid");
}

}  // namespace
}  // namespace internal
}  // namespace percpu
