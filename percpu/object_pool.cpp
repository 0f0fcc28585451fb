// Slow paths of percpu::object_pool: refill and spill in batches, the depot,
// chunks, trim, fork, and the misuse checks. The cache protocol is argued in
// percpu/internal/cpu_slots.hpp and percpu/internal/rseq_cs.hpp.

#include "percpu/object_pool.hpp"
#include "percpu/internal/fallback.hpp"
#include "percpu/internal/nocancel.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <new>
#include <stdexcept>
#include <string>

#include "percpu/cpu.hpp"

namespace percpu {

namespace {

// Chunks are mapped at their own alignment, so the chunk of any pointer is
// found by masking, without reading memory the pointer might not own.
constexpr std::size_t kChunkBytes = std::size_t{1} << 18;
constexpr std::size_t kMaxObjectSize = kChunkBytes / 16;
constexpr std::size_t kMaxAlignment = 4096;
constexpr std::size_t kDefaultCacheBytes = 16384;
constexpr std::size_t kMinDefaultCapacity = 8;
constexpr std::size_t kMaxDefaultCapacity = 128;
constexpr int kTrimTries = 64;
// A thread's own cache (a thread without rseq) has as many spares as a
// CPU's: see "a thread's own spares" below.
constexpr int kOwnSpares = internal::kSpares;
static_assert(kOwnSpares == 2, "set_aside_own keeps the newer spare, lets the older go");

std::size_t round_up(std::size_t n, std::size_t to) { return (n + to - 1) / to * to; }

// One line on stderr with a single write(2), then abort: usable anywhere,
// including a signal handler, and not a cancellation point.
[[noreturn]] void die(const char* what, const void* p) noexcept {
  char line[200];
  std::size_t n = 0;
  for (const char* s = "percpu::object_pool: "; *s != '\0'; ++s) line[n++] = *s;
  for (const char* s = what; *s != '\0' && n < 150; ++s) line[n++] = *s;
  const char* hex = "0123456789abcdef";
  line[n++] = ' ';
  line[n++] = '0';
  line[n++] = 'x';
  const auto value = reinterpret_cast<std::uintptr_t>(p);
  for (int shift = 60; shift >= 0; shift -= 4) line[n++] = hex[(value >> shift) & 0xf];
  line[n++] = '\n';
  internal::nocancel_write(STDERR_FILENO, line, n);
  std::abort();
}

}  // namespace

// The header at the start of every chunk, then the allocation bitmap (used
// only with checks on), then the objects.
struct object_pool::chunk {
  chunk* next;
  char* first;
  std::size_t objects;
  std::uint64_t* bits;
};

object_pool::object_pool(std::size_t object_size, std::size_t alignment)
    : object_pool([&] {
        options o;
        o.object_size = object_size;
        o.alignment = alignment;
        return o;
      }()) {}

object_pool::object_pool(const options& opts) {
  if (opts.object_size == 0 || opts.object_size > kMaxObjectSize) {
    throw std::invalid_argument("percpu::object_pool: object size " +
                                std::to_string(opts.object_size) + " is not in [1, " +
                                std::to_string(kMaxObjectSize) + "]");
  }
  if (opts.alignment == 0 || (opts.alignment & (opts.alignment - 1)) != 0 ||
      opts.alignment > kMaxAlignment) {
    throw std::invalid_argument("percpu::object_pool: alignment " + std::to_string(opts.alignment) +
                                " is not a power of two no larger than " +
                                std::to_string(kMaxAlignment));
  }
  if (opts.cache_capacity > max_cache_capacity) {
    throw std::invalid_argument("percpu::object_pool: cache capacity " +
                                std::to_string(opts.cache_capacity) + " is above the maximum " +
                                std::to_string(max_cache_capacity));
  }
  alignment_ = opts.alignment < alignof(node) ? alignof(node) : opts.alignment;
  object_size_ = opts.object_size;
  stride_ = round_up(object_size_ < sizeof(node) ? sizeof(node) : object_size_, alignment_);
  std::size_t capacity = opts.cache_capacity;
  if (capacity == 0) {
    capacity = kDefaultCacheBytes / stride_;
    if (capacity < kMinDefaultCapacity) capacity = kMinDefaultCapacity;
    if (capacity > kMaxDefaultCapacity) capacity = kMaxDefaultCapacity;
  }
  std::size_t batch = opts.batch == 0 ? (capacity + 1) / 2 : opts.batch;
  if (batch > capacity) batch = capacity;
  capacity_ = static_cast<std::intptr_t>(capacity);
  batch_ = static_cast<std::intptr_t>(batch);
  checks_ = opts.checks;

  depot_flag_ = 0;
  depot_free_ = nullptr;
  depot_count_ = 0;
  chunks_ = nullptr;
  carve_next_ = carve_end_ = nullptr;
  carved_ = 0;
  register_for_fork();
  // Cheap now if the program has not started threads yet; see cpu_slots.hpp.
  (void)internal::prepare_remote_fences();
}

object_pool::~object_pool() {
  unregister_for_fork();
  for (chunk* c = chunks_; c != nullptr;) {
    chunk* next = c->next;
    munmap(c, kChunkBytes);
    c = next;
  }
}

// Waits for every flag while holding the ones already taken: safe by rule
// R3 of percpu/internal/cpu_slots.hpp (every holder finishes without waiting
// for anything). The depot comes last only to keep it held for the shortest
// time, so threads that wait for it (holding nothing) are kept waiting least.
void object_pool::before_fork() noexcept {
  lists_.before_fork();
  internal::fork_wait_for_flag(&depot_flag_);
}

void object_pool::after_fork(bool child) noexcept {
  internal::fork_release_flag(&depot_flag_);
  lists_.after_fork(child);
}

// ---- depot ---------------------------------------------------------------

// Waits for the depot only when this thread holds no other flag of percpu
// (rule R1 of percpu/internal/cpu_slots.hpp). False: the thread holds one
// (it is a signal handler that interrupted a slow path, possibly this
// depot's own holder) and the depot was busy; the caller must not wait.
bool object_pool::depot_lock() noexcept { return internal::take_flag(&depot_flag_); }

void object_pool::depot_unlock() noexcept { internal::release_flag(&depot_flag_); }

bool object_pool::carve_chunk_locked() noexcept {
  // Map twice the size and keep the aligned middle, so the chunk of any
  // object is its address rounded down.
  void* raw =
      mmap(nullptr, 2 * kChunkBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return false;
  const auto start = reinterpret_cast<std::uintptr_t>(raw);
  const std::uintptr_t aligned = round_up(start, kChunkBytes);
  if (aligned > start) munmap(raw, aligned - start);
  const std::uintptr_t tail = aligned + kChunkBytes;
  if (start + 2 * kChunkBytes > tail) {
    munmap(reinterpret_cast<void*>(tail), start + 2 * kChunkBytes - tail);
  }
  auto* c = reinterpret_cast<chunk*>(aligned);
  const std::size_t max_objects = kChunkBytes / stride_;
  const std::size_t bitmap_words = (max_objects + 63) / 64;
  c->bits = reinterpret_cast<std::uint64_t*>(c + 1);
  const std::size_t header =
      round_up(sizeof(chunk) + bitmap_words * sizeof(std::uint64_t), alignment_);
  c->first = reinterpret_cast<char*>(aligned) + header;
  c->objects = (kChunkBytes - header) / stride_;
  c->next = chunks_;
  internal::tsan_release(c);  // the mapping, for the threads that carve from it (depot_take)
  __atomic_store_n(&chunks_, c, __ATOMIC_RELEASE);
  carve_next_ = c->first;
  carve_end_ = c->first + c->objects * stride_;
  return true;
}

// ---- the depot's chains -------------------------------------------------------
//
// Everything the depot holds, and everything on its way there, is a chain
// that counts its own depths: linked to nullptr, each node's depth its
// distance from the bottom plus one, so the first node's depth is the
// chain's length. A cache taken whole (trim, or an older spare let go) is
// one as it stands; a spill builds one as it pops (spill_batch). The depot
// keeps such chains on a stack, so giving one and taking one are a few
// stores under the lock whatever its length, and a chain taken onto an
// empty cache is pushed as it is, without a walk. A refill then touches
// two of its nodes, not all of them, one after another, while the CPU that
// freed them still holds their lines (and, before, under the lock the
// other CPUs wait for).
//
// The link to the next chain on the stack is kept in a word the chain's
// depths make redundant: the second node's depth (always the first's minus
// one), or, in a chain of one node, its next (always nullptr).

namespace {

// The next chain on the stack after the one whose first node is `first`.
template <class Node>
Node* chain_link(Node* first) noexcept {
  return first->depth == 1 ? first->next : reinterpret_cast<Node*>(first->next->depth);
}
template <class Node>
void set_chain_link(Node* first, Node* link) noexcept {
  if (first->depth == 1) {
    first->next = link;
  } else {
    first->next->depth = reinterpret_cast<std::intptr_t>(link);
  }
}
// Puts back the word the link took.
template <class Node>
void clear_chain_link(Node* first) noexcept {
  if (first->depth == 1) {
    first->next = nullptr;
  } else {
    first->next->depth = first->depth - 1;
  }
}

// Gives the `count` nodes from `first` on the depths below + count down to
// below + 1, top to bottom, and returns the last of them: a chain that
// counts its depths (below 0), or one about to go above a list of `below`.
template <class Node>
Node* count_depths(Node* first, std::intptr_t count, std::intptr_t below) noexcept {
  Node* x = first;
  for (std::intptr_t depth = below + count; depth > below + 1; --depth) {
    x->depth = depth;
    x = x->next;
  }
  x->depth = below + 1;
  return x;
}

}  // namespace

// Under the depot lock: the overflow stack's objects, as chains of up to a
// batch, so that a refill never takes more than a cache holds. Returns how
// many objects it moved.
std::size_t object_pool::drain_overflow_locked() noexcept {
  std::size_t moved = 0;
  node* rest = reinterpret_cast<node*>(lists_.overflow_take_all());
  while (rest != nullptr) {
    node* first = rest;
    node* last = first;
    std::intptr_t count = 1;
    while (count < batch_ && last->next != nullptr) {
      last = last->next;
      ++count;
    }
    rest = last->next;
    last->next = nullptr;
    count_depths(first, count, 0);
    set_chain_link(first, depot_free_);
    depot_free_ = first;
    depot_count_ += count;
    moved += static_cast<std::size_t>(count);
  }
  return moved;
}

// Under the depot lock: a chain that counts its depths (see above), of *got
// objects: the top one of the stack, else up to `want` new objects.
object_pool::node* object_pool::depot_take(std::intptr_t want, std::intptr_t* got) noexcept {
  if (depot_free_ == nullptr) drain_overflow_locked();
  if (node* first = depot_free_) {
    depot_free_ = chain_link(first);
    clear_chain_link(first);
    *got = first->depth;
    depot_count_ -= first->depth;
    return first;
  }
  node* first = nullptr;
  std::intptr_t n = 0;
  const bool tsan = internal::tsan_present();
  while (n < want) {
    if (carve_next_ == carve_end_ && !carve_chunk_locked()) break;
    node* x = reinterpret_cast<node*>(carve_next_);
    if (tsan) {  // a new object: its mapping comes before its first owner (object_pool.hpp)
      internal::tsan_acquire(chunks_);
      internal::tsan_release(x);
    }
    carve_next_ += stride_;
    ++carved_;
    x->next = first;
    x->depth = ++n;
    first = x;
  }
  *got = n;
  return first;
}

// Gives the chain first..last (count objects, its depths counted from its
// bottom; last may be nullptr, not known) to the depot, or to the overflow
// stack when this thread may not wait for the depot and it is busy.
void object_pool::depot_give(node* first, node* last, std::intptr_t count) noexcept {
#ifndef NDEBUG
  if (first->depth != count) die("a chain on its way to the depot miscounts its depths at", first);
#endif
  if (!depot_lock()) {
    if (last == nullptr) {
      for (last = first; last->next != nullptr;) last = last->next;
    }
    lists_.to_overflow(reinterpret_cast<std::intptr_t>(first),
                       reinterpret_cast<std::intptr_t>(last));
    return;
  }
  set_chain_link(first, depot_free_);
  depot_free_ = first;
  depot_count_ += count;
  depot_unlock();
}

// Gives a whole cache to the depot: first, then ->next up to nullptr. Its
// depths count from its bottom already; they are counted again on the walk
// that finds its end anyway, so that nothing the depot keeps rests on a
// depth that was only ever read speculatively. Returns how many objects it
// moved.
std::size_t object_pool::depot_give_list(node* first) noexcept {
  if (first == nullptr) return 0;
  node* last = first;
  std::intptr_t count = 1;
  while (last->next != nullptr) {
    last = last->next;
    ++count;
  }
  count_depths(first, count, 0);
  depot_give(first, last, count);
  return static_cast<std::size_t>(count);
}

std::size_t object_pool::depot_objects() const noexcept {
  return static_cast<std::size_t>(__atomic_load_n(&depot_count_, __ATOMIC_RELAXED));
}

std::size_t object_pool::carved_objects() const noexcept {
  return __atomic_load_n(&carved_, __ATOMIC_RELAXED);
}

std::size_t object_pool::cached_on(int cpu) const noexcept {
  if (cpu < 0 || cpu >= lists_.count()) return 0;
  const std::intptr_t head = lists_.head_of(cpu);
  if (head == internal::kSlotLocked) return 0;
  return static_cast<std::size_t>(depth_of(head));
}

std::size_t object_pool::spare_on(int cpu) const noexcept {
  if (cpu < 0 || cpu >= lists_.count()) return 0;
  std::size_t sum = 0;
  for (int which = 0; which < internal::kSpares; ++which) {
    sum += static_cast<std::size_t>(depth_of(lists_.spare_head_of(cpu, which)));
  }
  return sum;
}

std::size_t object_pool::cached_by_threads() const noexcept {
  std::size_t sum = 0;
  for (int i = 0; i < lists_.thread_limit(); ++i) {
    sum += static_cast<std::size_t>(depth_of(lists_.thread_head_of(i))) +
           own_spare_objects(lists_.thread_spare_of(i));
  }
  return sum;
}

// ---- caches ----------------------------------------------------------------

// Objects on their way to the depot, linked first..last (last's next is
// nullptr), each node's depth counted from the bottom as it is put on: a
// chain the depot keeps as it is (see "the depot's chains").
struct object_pool::spill_batch {
  node* first = nullptr;
  node* last = nullptr;
  std::intptr_t count = 0;
  void push_front(node* x) noexcept {
    x->next = first;
    x->depth = ++count;
    first = x;
    if (last == nullptr) last = x;
  }
};

// Puts the chain first..nullptr (count objects, its depths counted from its
// bottom) on the calling thread's cache in one step (internal/cpu_lists.hpp,
// the ladder), if it fits. On an empty cache, the common case (a refill
// follows an empty cache), the chain goes as it is; above other objects its
// depths are counted again from theirs and its bottom linked to them, which
// walks it. False: nothing was put there, and the chain is as it came.
bool object_pool::push_chain_home(node* first, std::intptr_t count) noexcept {
  using internal::index_kind;
  node* last = nullptr;     // found by the first walk
  std::intptr_t above = 0;  // the depth the chain's depths now start from
  auto place_above = [&](std::intptr_t below, std::intptr_t top) {
    if (below != above || (top != 0 && last == nullptr)) {
      last = count_depths(first, count, below);
      above = below;
    }
    if (last != nullptr) last->next = reinterpret_cast<node*>(top);
  };
  const bool pushed = lists_.at_home(
      internal::section_area(),
      [&](internal::rseq_area* area) {
        for (int tries = 0; tries < internal::kSectionTries; ++tries) {
          const int cpu = internal::rseq_current_index<index_kind::cpu_id>(area);
          if (static_cast<unsigned>(cpu) >= static_cast<unsigned>(lists_.count())) return false;
          std::intptr_t* head = &lists_.slot_of(cpu)->head;
          const std::intptr_t expect = __atomic_load_n(head, __ATOMIC_RELAXED);
          if (expect == internal::kSlotLocked) return false;
          const std::intptr_t depth = depth_of(expect);
          if (depth + count > capacity_) return false;
          place_above(depth, expect);
          if (internal::rseq_cmpeqv_cmpeqv_storev<index_kind::cpu_id>(
                  area, head, expect, depth_word(expect), depth,
                  reinterpret_cast<std::intptr_t>(first), cpu) == 0) {
            return true;
          }
        }
        return false;
      },
      [&](std::intptr_t* head) {
        const std::intptr_t depth = depth_of(*head);
        if (depth + count > capacity_) return false;
        place_above(depth, *head);
        *head = reinterpret_cast<std::intptr_t>(first);
        return true;
      });
  if (!pushed) place_above(0, 0);
  return pushed;
}

// Where the started section did not pop: this CPU's cache again, or a
// thread without rseq's own cache or its hint CPU's (the ladder), then the
// refill, kept apart so that those common cases pay for no more than a call.
void* object_pool::allocate_slow() noexcept {
  // A thread already known to have no rseq (its first section_area() said
  // so) tries its own cache first, with nothing else asked: its common case,
  // kept as short as deallocate_slow's. Otherwise the started section
  // aborted (the ladder tries again, a bounded number of times), or found
  // the cache empty or locked (then this fails at once too); or this is a
  // thread's first operation without rseq.
  std::intptr_t popped = 0;
  if (internal::t_section_state == internal::section_user::no_rseq) {
    popped = lists_.pop_own();
    if (__builtin_expect(popped == 0, 0)) popped = pop_own_spare();
  }
  if (popped != 0 || (popped = lists_.pop_home(internal::section_area())) != 0) {
    if (checks_) check_allocate(reinterpret_cast<void*>(popped));
    return reinterpret_cast<void*>(popped);
  }
  return allocate_refill();
}

// Whether the CPU the thread runs on has a spare in use: a racy peek (the
// thread may move, the spares change), for skipping the lock. The newer
// spare is enough to look at: the older is in use only while it is.
bool object_pool::spare_seen(internal::rseq_area* area) const noexcept {
  const int cpu = internal::rseq_current_index<internal::index_kind::cpu_id>(area);
  return static_cast<unsigned>(cpu) < static_cast<unsigned>(lists_.count()) &&
         lists_.spare_head_of(cpu) != 0;
}

// The cache is empty (or locked, or its sections kept aborting). With rseq,
// the CPU's spares first: locked from a section, a cache that is still
// empty takes the newer spare whole, with its depths as they are (they
// count from its bottom), and the next allocations are local again; no
// depot, no walk. Spares that read empty are not worth the lock. Then the
// overflow stack, then the depot.
void* object_pool::allocate_refill() noexcept {
  internal::rseq_area* area = internal::section_area();
  if (area != nullptr && spare_seen(area)) {
    std::intptr_t popped = 0;
    if (lists_.on_local_cpu_slot(area, [&](std::intptr_t* head, int cpu) {
          if (*head == 0) *head = lists_.take_spare(cpu);
          return internal::pop_held(head, &popped);
        })) {
      if (checks_) check_allocate(reinterpret_cast<void*>(popped));
      return reinterpret_cast<void*>(popped);
    }
  }
  node* result = reinterpret_cast<node*>(lists_.overflow_pop());
  if (result == nullptr) {
    // A handler that interrupted a flag holder on this thread, with the depot
    // busy: waiting could deadlock (cpu_slots.hpp, R1), so report nothing.
    if (!depot_lock()) return nullptr;
    std::intptr_t got = 0;
    result = depot_take(batch_ + 1, &got);
    depot_unlock();
    if (result == nullptr) return nullptr;  // out of memory
    if (got > 1) {
      node* rest = result->next;
      result->next = nullptr;
      if (!push_chain_home(rest, got - 1)) depot_give(rest, nullptr, got - 1);
    }
  }
  if (checks_) check_allocate(result);
  return result;
}

// Where the inline section did not push n: the cache is full, locked, or
// sections kept aborting; or the thread has no rseq. A thread without rseq
// whose own cache has room is the common case, kept apart from the spill so
// that it pays for no more than a call.
void object_pool::deallocate_slow(node* n, bool has_sections) noexcept {
  if (!has_sections && lists_.on_own_list([&](std::intptr_t* head) {
        const std::intptr_t depth = depth_of(*head);
        if (depth >= capacity_) return false;
        n->next = reinterpret_cast<node*>(*head);
        n->depth = depth + 1;
        *head = reinterpret_cast<std::intptr_t>(n);
        return true;
      })) {
    return;
  }
  deallocate_spill(n, has_sections);
}

// The cache is full (or locked, or its sections kept aborting), or the
// thread has no rseq. Under the cache's lock, a full cache makes room and
// n goes onto it, so the next frees are local again. A thread with rseq
// locks its CPU's cache from a section; there a full cache becomes the
// newer spare whole, and the newer the older (no walk: allocate_refill
// takes them back, newest first, as the cache runs empty, so bursts of up
// to three times the capacity, less the batch a refill may bring, stay on
// the CPU: a slab allocator's previous magazine, one deeper). With both
// spares in use the older one, a whole cache, goes to the depot once the
// lock is let go: a magazine is as cheap to move as a batch, and moving
// the most the CPU can spare keeps it off the depot longest. Where the
// CPU's lock is busy, a batch is popped a section per object instead. A
// thread without rseq does the same on its own cache, with its own spares
// (set_aside_own); on its hint CPU's cache, locked (the ladder's step 3),
// there are no spares, and the cache's top batch goes to the depot (the
// depths below stay right, since they count from the bottom). On the depot
// when no cache can be had now. The depot is only reached once no list is
// held (R1).
void object_pool::deallocate_spill(node* n, bool has_sections) noexcept {
  spill_batch spill;
  node* fallen = nullptr;  // the older spare that set_aside let go
  auto push = [&](std::intptr_t* head) {
    n->next = reinterpret_cast<node*>(*head);
    n->depth = depth_of(*head) + 1;
    *head = reinterpret_cast<std::intptr_t>(n);
    return true;
  };
  auto shed_and_push = [&](std::intptr_t* head) {
    if (depth_of(*head) >= capacity_) shed_batch(head, &spill);
    return push(head);
  };
  auto set_aside_and_push = [&](std::intptr_t* head, int cpu) {
    if (depth_of(*head) >= capacity_) {
      fallen = reinterpret_cast<node*>(lists_.set_aside(cpu, *head));
      *head = 0;
    }
    return push(head);
  };
  internal::rseq_area* area = has_sections ? internal::section_area() : nullptr;
  bool cached = false;
  if (area != nullptr) {
    cached = lists_.on_local_cpu_slot(area, set_aside_and_push);
    if (!cached) spill_in_sections(area, &spill);
  } else {
    cached = lists_.on_own_slot([&](internal::thread_slot* own) {
      fallen = set_aside_own(own, n);
      return true;
    }) || lists_.on_hint_cpu_list(shed_and_push);
  }
  if (fallen != nullptr) depot_give(fallen, nullptr, fallen->depth);
  if (!cached) spill.push_front(n);
  if (spill.count > 0) depot_give(spill.first, spill.last, spill.count);
}

// ---- a thread's own spares ------------------------------------------------
//
// A thread without rseq keeps its spares as a CPU does (set aside whole when
// its cache is full, taken back newest first when it runs empty, the older
// let go whole to the depot), in the one word its slot has beside the
// cache's head (internal/thread_slots.hpp): a stack of up to kOwnSpares
// whole caches, each counting its depths from its bottom, linked as the
// depot links its chains (chain_link). So its bursts of up to three
// capacities stay in the thread, and what goes to the depot or comes from it
// is a whole cache, never a walk. The stack is the thread's alone while it
// is inside its slot; a trim() that revokes the slot takes it whole
// (drain). The stores follow the order thread_slots.hpp's "Fork" asks
// for: a cache leaves the word it was in before it joins the other.

// The own cache `own` (entered) is full: set it aside as the newer spare
// and start a new cache with n. Returns the older spare if both were in
// use (the caller's now, a chain the depot takes as it is), else nullptr.
// A cache that is not full (a signal handler took objects meanwhile) just
// takes n.
object_pool::node* object_pool::set_aside_own(internal::thread_slot* own, node* n) noexcept {
  node* full = reinterpret_cast<node*>(internal::thread_slot_head(own));
  const std::intptr_t depth = depth_of(reinterpret_cast<std::intptr_t>(full));
  if (depth < capacity_) {
    n->next = full;
    n->depth = depth + 1;
    internal::set_thread_slot_head(own, reinterpret_cast<std::intptr_t>(n));
    return nullptr;
  }
  // The newer spare stays, below the cache set aside; the older, if in use,
  // leaves the stack with one store.
  node* newer = reinterpret_cast<node*>(internal::thread_slot_spare(own));
  node* older = newer != nullptr ? chain_link(newer) : nullptr;
  if (older != nullptr) {
    set_chain_link(newer, static_cast<node*>(nullptr));
    clear_chain_link(older);
  }
  n->next = nullptr;
  n->depth = 1;
  internal::set_thread_slot_head(own, reinterpret_cast<std::intptr_t>(n));
  set_chain_link(full, newer);
  internal::set_thread_slot_spare(own, reinterpret_cast<std::intptr_t>(full));
  return older;
}

// A thread without rseq whose own cache ran empty: its newer spare becomes
// the cache, whole, and its top is returned; 0 when it has no spare (or no
// slot it can enter now).
std::intptr_t object_pool::pop_own_spare() noexcept {
  std::intptr_t popped = 0;
  lists_.on_own_slot([&](internal::thread_slot* own) {
    node* top = reinterpret_cast<node*>(internal::thread_slot_head(own));
    if (top == nullptr) {  // else a signal handler freed onto it meanwhile
      top = reinterpret_cast<node*>(internal::thread_slot_spare(own));
      if (top == nullptr) return false;
      internal::set_thread_slot_spare(own, reinterpret_cast<std::intptr_t>(chain_link(top)));
      clear_chain_link(top);
    }
    internal::set_thread_slot_head(own, reinterpret_cast<std::intptr_t>(top->next));
    popped = reinterpret_cast<std::intptr_t>(top);
    return true;
  });
  return popped;
}

// The objects in the spare stack `top` (a thread's spare word), read racily
// by cached_by_threads(): a link is followed only to an object of this pool,
// so a stack changing meanwhile gives a wrong sum, never a wild read.
std::size_t object_pool::own_spare_objects(std::intptr_t top) const noexcept {
  std::size_t sum = 0;
  node* c = reinterpret_cast<node*>(top);
  for (int i = 0; i < kOwnSpares && c != nullptr && owns(c); ++i) {
    const std::intptr_t depth = depth_of(reinterpret_cast<std::intptr_t>(c));
    if (depth < 1 || depth > capacity_) break;
    sum += static_cast<std::size_t>(depth);
    node* second = __atomic_load_n(&c->next, __ATOMIC_RELAXED);
    if (depth == 1) {
      c = second;
    } else {
      c = owns(second) ? reinterpret_cast<node*>(depth_of(reinterpret_cast<std::intptr_t>(second)))
                       : nullptr;
    }
  }
  return sum;
}

// Moves the top batch of the list whose head is *head, held exclusively,
// onto *spill.
void object_pool::shed_batch(std::intptr_t* head, spill_batch* spill) noexcept {
  while (spill->count < batch_ && *head != 0) {
    node* x = reinterpret_cast<node*>(*head);
    *head = reinterpret_cast<std::intptr_t>(x->next);
    spill->push_front(x);
  }
}

// Pops up to a batch from the calling CPU's cache, one section each, onto
// *spill; stops at an empty or locked cache, or after kSectionTries aborts.
void object_pool::spill_in_sections(internal::rseq_area* area, spill_batch* spill) noexcept {
  using internal::index_kind;
  int failures = 0;
  while (spill->count < batch_ && failures < internal::kSectionTries) {
    const int cpu = internal::rseq_current_index<index_kind::cpu_id>(area);
    if (static_cast<unsigned>(cpu) >= static_cast<unsigned>(lists_.count())) break;
    std::intptr_t popped = 0;
    const int rc = internal::rseq_cmpabovev_storeoffp_load<index_kind::cpu_id>(
        area, &lists_.slot_of(cpu)->head, internal::kSlotLocked, offsetof(node, next), &popped,
        cpu);
    if (rc == 1) break;  // empty, or locked
    if (rc < 0) {
      ++failures;
      continue;
    }
    spill->push_front(reinterpret_cast<node*>(popped));
  }
}

std::size_t object_pool::trim() noexcept {
  std::size_t moved = 0;
  lists_.drain(
      kTrimTries,
      [&](std::intptr_t head) { moved += depot_give_list(reinterpret_cast<node*>(head)); },
      [&](std::intptr_t spares) {  // a thread's own spares, a stack of chains
        for (node* c = reinterpret_cast<node*>(spares); c != nullptr;) {
          node* next = chain_link(c);
          clear_chain_link(c);
          moved += depot_give_list(c);
          c = next;
        }
      });
  if (depot_lock()) {
    moved += drain_overflow_locked();
    depot_unlock();
  }
  return moved;
}

// ---- checks ------------------------------------------------------------------

bool object_pool::owns(const void* p) const noexcept {
  const auto address = reinterpret_cast<std::uintptr_t>(p);
  const std::uintptr_t base = address & ~(kChunkBytes - 1);
  for (chunk* c = __atomic_load_n(&chunks_, __ATOMIC_ACQUIRE); c != nullptr; c = c->next) {
    if (reinterpret_cast<std::uintptr_t>(c) != base) continue;
    const auto first = reinterpret_cast<std::uintptr_t>(c->first);
    return address >= first && (address - first) % stride_ == 0 &&
           (address - first) / stride_ < c->objects;
  }
  return false;
}

namespace {

// Finds p's chunk and object index; false when p is not an object of `chunks`.
template <typename Chunk>
bool locate(Chunk* chunks, std::size_t stride, const void* p, Chunk** found, std::size_t* index,
            bool* interior) {
  const auto address = reinterpret_cast<std::uintptr_t>(p);
  const std::uintptr_t base = address & ~(kChunkBytes - 1);
  *interior = false;
  for (Chunk* c = chunks; c != nullptr; c = c->next) {
    if (reinterpret_cast<std::uintptr_t>(c) != base) continue;
    const auto first = reinterpret_cast<std::uintptr_t>(c->first);
    if (address < first || (address - first) / stride >= c->objects) return false;
    if ((address - first) % stride != 0) {
      *interior = true;
      return false;
    }
    *found = c;
    *index = (address - first) / stride;
    return true;
  }
  return false;
}

}  // namespace

void object_pool::check_allocate(void* p) noexcept {
  chunk* c = nullptr;
  std::size_t index = 0;
  bool interior = false;
  if (!locate(__atomic_load_n(&chunks_, __ATOMIC_ACQUIRE), stride_, p, &c, &index, &interior)) {
    die("internal error: a cache held a pointer that is not an object of this pool "
        "(memory corrupted, or an object written after deallocate):",
        p);
  }
  const std::uint64_t bit = std::uint64_t{1} << (index % 64);
  if ((__atomic_fetch_or(&c->bits[index / 64], bit, __ATOMIC_RELAXED) & bit) != 0) {
    die("object handed out twice (an object was deallocated twice, or written after "
        "deallocate):",
        p);
  }
}

void object_pool::check_deallocate(void* p) noexcept {
  chunk* c = nullptr;
  std::size_t index = 0;
  bool interior = false;
  if (!locate(__atomic_load_n(&chunks_, __ATOMIC_ACQUIRE), stride_, p, &c, &index, &interior)) {
    die(interior ? "deallocate of a pointer into the middle of an object:"
                 : "deallocate of a pointer that this pool did not allocate:",
        p);
  }
  const std::uint64_t bit = std::uint64_t{1} << (index % 64);
  if ((__atomic_fetch_and(&c->bits[index / 64], ~bit, __ATOMIC_RELAXED) & bit) == 0) {
    die("double free (deallocate of an object that is not allocated):", p);
  }
}

}  // namespace percpu
