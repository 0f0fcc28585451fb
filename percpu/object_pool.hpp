// percpu/object_pool.hpp: a pool of fixed-size objects with per-CPU caches.
//
// What it is for
//   Allocating and freeing many objects of one size from many threads, fast:
//   allocate() and deallocate() take and return objects on a small per-CPU
//   cache with one rseq critical section each, no atomic instruction and no
//   lock. Caches are bounded. With rseq each CPU also has two spares: a
//   full cache is set aside whole as a spare, and an empty one takes the
//   newest spare back, each in one step under the CPU's own lock, so a
//   burst of up to three times the capacity (less a batch) stays on its
//   CPU (the previous magazine of a slab allocator, one deeper). A full
//   cache beside two spares in use sends the older spare to a shared depot
//   whole; an empty cache with no spare takes the depot's newest chain (a
//   batch, or a cache some CPU let go), one lock each. trim() empties
//   every cache and spare into the depot from any thread.
//
// When not to use it
//   For objects of varying sizes, or when memory must go back to the system
//   before the pool is destroyed: the pool keeps every chunk it carved until
//   its destructor, which frees them all (objects still allocated included).
//   The memory of a freed object is reused for the pool's links, so objects
//   must not be touched after deallocate().
//
// Without rseq
//   A thread without rseq (seccomp, valgrind, qemu-user, a forced fallback)
//   has a cache of its own in each pool, a thread slot
//   (percpu/internal/thread_slots.hpp), with two spares as a CPU's cache
//   has: allocate and deallocate there are plain loads and stores between a
//   "busy" store and a check that no other thread revoked the slot, with no
//   atomic instruction and no system call, the way a malloc's thread cache
//   works. A full cache is set aside whole, an empty one takes the newer
//   spare back, and beyond the spares whole caches go to and come from the
//   depot, as with rseq. trim() revokes
//   these caches with one membarrier system call each; fork() writes
//   nothing to them and waits only for a trim() moving one. Where the
//   membarrier command is missing, or beyond the thread slots' number of live
//   threads, such a thread locks the cache of a CPU it ran on recently
//   (internal::cpu_hint(): no getcpu per operation), with atomics, under the
//   protocol of percpu/internal/cpu_slots.hpp (a membarrier fence per
//   operation only if some thread of the process does run sections); when
//   that cache cannot be locked, it goes to the depot. Nothing waits for a
//   cache another thread holds; the depot lock is held only for short batch
//   moves.
//
// Errors and misuse
//   The constructor throws std::invalid_argument for a zero or oversized
//   object size, an alignment that is not a power of two or too large, or a
//   cache capacity too large for the caches' depth arithmetic, and
//   std::bad_alloc when no memory can be mapped for its per-CPU heads. A zero cache
//   capacity or batch picks a default (see options); a batch above the
//   capacity is lowered to it. allocate() returns nullptr when memory is
//   exhausted.
//   With checks on (options::checks; on by default unless NDEBUG), a
//   deallocate() of a pointer this pool did not hand out (foreign, misaligned
//   or interior), a double free, and an object handed out twice print one
//   line on stderr naming the problem and abort. With checks off these are
//   undefined behaviour: a foreign pointer or a double free corrupts the pool.
//   deallocate(nullptr) does nothing.
//
// Memory
//   The pool itself (192 bytes), plus 32 bytes for each CPU whose threads
//   used it with rseq (that CPU's cache's and spares' heads and the cache's
//   lock, on percpu's per-CPU memory, internal/stride_arena.hpp: a CPU that
//   never touches a pool costs it nothing, so a possible list of 0-4095
//   costs what 0-1 does), plus 32
//   bytes for each thread without rseq that used it (its cache's head, its
//   spares' word, its busy, revoked and lock words, on
//   percpu's memory laid out by thread index, internal/thread_slots.hpp),
//   plus the objects: 256 KiB chunks, reserved, whose pages fill as objects
//   are carved, the first with the chunk's header and bitmap. 300 pools of
//   64-byte objects, each used once, take about 8,700 bytes each
//   (percpu-bench --structures, the memory table), nearly all of it the
//   first two pages of each pool's chunk. Free objects out of the depot:
//   up to three caches' worth for each CPU used with rseq and each thread
//   without it, until trim().
//
// By CPU only: no concurrency-id form
//   The caches are free lists (free_list.hpp says why those stay by CPU):
//   trim(), fork() and a refill that steals read one cache head per
//   possible CPU, and a cache no CPU touched costs no memory.
//
// Thread safety and signals
//   allocate, deallocate and trim are thread-safe. deallocate is
//   async-signal-safe. allocate is async-signal-safe too, with one limit: a
//   handler that interrupted its thread inside a slow path of percpu's
//   structures (this pool's or another's) never waits for the depot, so if it
//   finds its cache unavailable and the depot busy it returns nullptr rather
//   than risk a deadlock. trim is not async-signal-safe. Construction and
//   destruction are not thread-safe. fork() is supported, from any thread and
//   while other threads and their signal handlers use the pool: the child
//   keeps using it. No member is a cancellation point (deferred
//   pthread_cancel() never acts inside one, however long allocate() or
//   deallocate() wait for the depot).
//   Leaving an operation by a jump: a signal handler may leave an allocate
//   or deallocate it interrupted with siglongjmp, or end the thread there
//   with pthread_exit(). On the rseq fast paths nothing is held. On the
//   slow paths (the spares, refill and spill through the depot, threads
//   without rseq) the operation may keep a cache (with its spares) or the
//   depot locked for ever, with the objects it was moving: those are lost
//   (never handed out again), and with the depot left locked, allocate()
//   returns nullptr once its cache is empty and freed objects go to the
//   overflow stack. Nothing waits for
//   such a lock: fork() keeps a lock the forking thread's own left frame
//   holds as it is (in both processes); a lock held by a thread that has
//   since exited is reported by the trim(), fork() or wait for the depot
//   that meets it (one line on stderr; debug builds then abort, release
//   builds go on without it), and a live thread's lock held for ten
//   seconds is reported the same way. pthread_exit() in a handler unwinds
//   the interrupted operation's noexcept frame, where C++ may call
//   std::terminate.
//   ThreadSanitizer in your build sees each deallocate() happen before the
//   allocate() that returns that object again, however percpu was built
//   (README, "Sanitizers in your build").
#pragma once

#include <cstddef>
#include <cstdint>

#include "percpu/internal/cpu_lists.hpp"
#include "percpu/internal/fork_registry.hpp"
#include "percpu/internal/sanitizers.hpp"

#pragma GCC visibility push(default)  // exported (see percpu/cpu.hpp)
namespace percpu {

class object_pool final : private internal::fork_participant {
 public:
  struct options {
    std::size_t object_size = 0;
    std::size_t alignment = alignof(std::max_align_t);
    // Objects each CPU's cache may hold; 0 picks a default from the size.
    // At most max_cache_capacity.
    std::size_t cache_capacity = 0;
    // Objects moved per cache refill or spill; 0 picks half the capacity,
    // and a batch above the capacity is lowered to it.
    std::size_t batch = 0;
#ifdef NDEBUG
    bool checks = false;
#else
    bool checks = true;
#endif
  };

  // The largest options::cache_capacity accepted: a cache's depth plus a
  // batch must not overflow the depth counters.
  static constexpr std::size_t max_cache_capacity = PTRDIFF_MAX / 4;

  explicit object_pool(std::size_t object_size, std::size_t alignment = alignof(std::max_align_t));
  explicit object_pool(const options& opts);
  ~object_pool();
  object_pool(const object_pool&) = delete;
  object_pool& operator=(const object_pool&) = delete;

  // An object of object_size() bytes aligned to alignment(), or nullptr.
  void* allocate() noexcept;
  // Returns an object obtained from allocate() of this pool.
  void deallocate(void* p) noexcept;
  // Moves every cached object it can reach to the depot; returns how many.
  // Caches that are busy at that moment, or that cannot be fenced (no
  // membarrier while rseq is in use), keep theirs.
  std::size_t trim() noexcept;

  std::size_t object_size() const noexcept { return object_size_; }
  std::size_t alignment() const noexcept { return alignment_; }
  std::size_t cache_capacity() const noexcept { return static_cast<std::size_t>(capacity_); }
  std::size_t batch() const noexcept { return static_cast<std::size_t>(batch_); }
  int slot_count() const noexcept { return lists_.count(); }
  // Objects in the depot's free list right now.
  std::size_t depot_objects() const noexcept;
  // Objects carved from chunks so far (allocated, cached or in the depot).
  std::size_t carved_objects() const noexcept;
  // The depth recorded at the top of CPU `cpu`'s cache: a racy snapshot for
  // tests and diagnostics, never above cache_capacity().
  std::size_t cached_on(int cpu) const noexcept;
  // Objects in CPU `cpu`'s spares (see "What it is for"), a racy snapshot
  // like cached_on(), never above twice cache_capacity().
  std::size_t spare_on(int cpu) const noexcept;
  // Objects in the caches of threads without rseq and their spares (see
  // "Without rseq"), a racy snapshot like cached_on(); each thread's cache
  // and spares hold at most three times cache_capacity().
  std::size_t cached_by_threads() const noexcept;
  // Whether `p` points at an object slot of this pool (allocated or not).
  bool owns(const void* p) const noexcept;

 private:
  // A free object, as the caches and the depot link it. depth is the number
  // of objects from this one to the bottom of its cache, itself included (in
  // the depot, of its chain: see object_pool.cpp, "the depot's chains").
  struct node {
    node* next;
    std::intptr_t depth;
  };
  static_assert(offsetof(node, next) == 0, "a node's link is its first word (cpu_lists.hpp)");
  struct chunk;
  struct spill_batch;

  // The depth of an empty cache. Caches end in nullptr (so that a zeroed head
  // is an empty cache), and the word a push compares for the depth below it
  // is this one when there is no node below: one section for both cases.
  static constexpr std::intptr_t kEmptyDepth = 0;
  // Where the depth of the cache whose top is `head` (a node, or 0) is kept.
  // Only ever read, by depth_of() and by the push section's compare.
  static std::intptr_t* depth_word(std::intptr_t head) noexcept {
    return head != 0 ? &reinterpret_cast<node*>(head)->depth
                     : const_cast<std::intptr_t*>(&kEmptyDepth);
  }
#if defined(PERCPU_TSAN)
  // The read is speculative (the head may have been allocated meanwhile, and
  // the section then fails): under TSan a plain load it does not see.
  PERCPU_TSAN_UNSEEN static std::intptr_t depth_of(std::intptr_t head) noexcept {
    return *reinterpret_cast<volatile std::intptr_t*>(depth_word(head));
  }
#else
  static std::intptr_t depth_of(std::intptr_t head) noexcept {
    return __atomic_load_n(depth_word(head), __ATOMIC_RELAXED);
  }
#endif
  // has_sections: what the inline path's section_area() answered, so the
  // slow path of a thread without rseq does not ask again.
  void* allocate_slow() noexcept;
  void deallocate_slow(node* n, bool has_sections) noexcept;
  PERCPU_LOCAL __attribute__((noinline)) void* allocate_refill() noexcept;
  PERCPU_LOCAL bool spare_seen(internal::rseq_area* area) const noexcept;
  PERCPU_LOCAL __attribute__((noinline)) void deallocate_spill(node* n, bool has_sections) noexcept;
  PERCPU_LOCAL __attribute__((noinline)) void spill_in_sections(internal::rseq_area* area,
                                                                spill_batch* spill) noexcept;
  PERCPU_LOCAL __attribute__((noinline)) node* set_aside_own(internal::thread_slot* own,
                                                             node* n) noexcept;
  PERCPU_LOCAL __attribute__((noinline)) std::intptr_t pop_own_spare() noexcept;
  PERCPU_LOCAL std::size_t own_spare_objects(std::intptr_t top) const noexcept;
  PERCPU_LOCAL bool push_chain_home(node* first, std::intptr_t count) noexcept;
  PERCPU_LOCAL __attribute__((noinline)) void shed_batch(std::intptr_t* head,
                                                         spill_batch* spill) noexcept;
  PERCPU_LOCAL bool depot_lock() noexcept;
  PERCPU_LOCAL void depot_unlock() noexcept;
  PERCPU_LOCAL node* depot_take(std::intptr_t want, std::intptr_t* got) noexcept;
  PERCPU_LOCAL void depot_give(node* first, node* last, std::intptr_t count) noexcept;
  PERCPU_LOCAL std::size_t depot_give_list(node* first) noexcept;
  PERCPU_LOCAL std::size_t drain_overflow_locked() noexcept;
  PERCPU_LOCAL bool carve_chunk_locked() noexcept;
  void check_allocate(void* p) noexcept;
  void check_deallocate(void* p) noexcept;
  void before_fork() noexcept override;
  void after_fork(bool child) noexcept override;

  // Read-mostly, shared by every CPU.
  // The caches (internal/cpu_lists.hpp): one per possible CPU, one per
  // thread without rseq, and the overflow stack: objects freed by a thread
  // that could reach neither its cache nor the depot (a handler
  // interrupting depot work on its own thread).
  internal::cpu_lists lists_;
  std::intptr_t capacity_;
  std::intptr_t batch_;
  bool checks_;
  std::size_t object_size_;
  std::size_t alignment_;
  std::size_t stride_;

  // The depot, behind depot_flag_ (a flag of percpu/internal/cpu_slots.hpp):
  // a stack of chains, depot_free_ the first node of the top one.
  alignas(64) int depot_flag_;
  node* depot_free_;
  std::intptr_t depot_count_;
  chunk* chunks_;  // newest first; prepended with release, read lock-free
  char* carve_next_;
  char* carve_end_;
  std::size_t carved_;
};

// TSan (internal/sanitizers.hpp): deallocate releases the object after its
// last store to it, and allocate acquires what it returns, so the next
// owner's accesses come after the previous owner's.
// allocate's hot path is one started section (internal/cpu_slots.hpp, "The
// started form"); anything else goes out of line.
inline void* object_pool::allocate() noexcept {
  std::intptr_t popped = 0;
  if (__builtin_expect(lists_.pop_started(&popped), 1)) {
    void* p = reinterpret_cast<void*>(popped);
    PERCPU_TSAN_ACQUIRE(p);
    if (__builtin_expect(checks_, 0)) check_allocate(p);
    return p;
  }
  void* p = allocate_slow();  // aborted, empty (refill from the depot), locked, or no rseq
  if (p != nullptr) PERCPU_TSAN_ACQUIRE(p);
  return p;
}

inline void object_pool::deallocate(void* p) noexcept {
  using internal::index_kind;
  if (p == nullptr) return;
  if (__builtin_expect(checks_, 0)) check_deallocate(p);
  node* n = static_cast<node*>(p);
  internal::rseq_area* area = internal::section_area();
  if (__builtin_expect(area != nullptr, 1)) {
    for (int tries = 0; tries < internal::kSectionTries; ++tries) {
      const int cpu = internal::rseq_current_index<index_kind::cpu_id>(area);
      if (static_cast<unsigned>(cpu) >= static_cast<unsigned>(lists_.count())) break;
      std::intptr_t* head = &lists_.slot_of(cpu)->head;
      const std::intptr_t expect = __atomic_load_n(head, __ATOMIC_RELAXED);
      if (expect == internal::kSlotLocked) break;
      // Read outside the section, so it may be stale; the section re-checks
      // it (see rseq_cmpeqv_cmpeqv_storev in percpu/internal/rseq_cs.hpp).
      const std::intptr_t depth = depth_of(expect);
      if (depth >= capacity_) break;  // full: spill a batch
      n->next = reinterpret_cast<node*>(expect);
      n->depth = depth + 1;
      PERCPU_TSAN_RELEASE(n);
      if (internal::rseq_cmpeqv_cmpeqv_storev<index_kind::cpu_id>(
              area, head, expect, depth_word(expect), depth, reinterpret_cast<std::intptr_t>(n),
              cpu) == 0) {
        return;
      }
    }
  }
  PERCPU_TSAN_RELEASE(n);
  deallocate_slow(n, area != nullptr);
}

}  // namespace percpu
#pragma GCC visibility pop
