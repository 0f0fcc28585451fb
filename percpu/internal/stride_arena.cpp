// Per-CPU memory by stride (stride_arena.hpp says the layout and the rules).

#include "percpu/internal/stride_arena.hpp"

#include <sys/mman.h>

#include <cerrno>

#include "percpu/cpu.hpp"

namespace percpu {
namespace internal {

namespace {

// At the start of CPU 0's region of each chunk.
struct chunk_header {
  std::atomic<std::uint32_t> used;  // objects carved, or tried to be
};
static_assert(sizeof(chunk_header) <= kStrideHeader, "the header fits before the first object");

}  // namespace

unsigned stride_arena::regions() const noexcept {
  return fixed_regions_ != 0 ? fixed_regions_ : static_cast<unsigned>(max_cpus());
}

// Reserved, zero-filled, populated page by page as CPUs touch it, and never
// by transparent huge pages: one would fill a whole 2 MiB (several regions,
// of CPUs that never ran) at the touch of one copy, where the kernel backs
// anonymous memory with them always (the aarch64-system lane's VM once did,
// under the stride arena's own test). Keeps errno (the callers promise to).
char* stride_arena::map_chunk() const noexcept {
  const int saved_errno = errno;
  void* memory = mmap(nullptr, regions() * kStride, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (memory != MAP_FAILED) (void)madvise(memory, regions() * kStride, MADV_NOHUGEPAGE);
  errno = saved_errno;
  return memory == MAP_FAILED ? nullptr : static_cast<char*>(memory);
}

void stride_arena::unmap_chunk(char* chunk) const noexcept {
  const int saved_errno = errno;
  munmap(chunk, regions() * kStride);
  errno = saved_errno;
}

// The words of each copy are read and written as relaxed atomics: other
// CPUs' sections wrote them with plain stores, before the object was freed.
void stride_arena::zero_every_copy(void* object, unsigned copies) const noexcept {
  const std::size_t words = size_ / sizeof(std::uintptr_t);
  for (unsigned c = 0; c < copies; ++c) {
    std::uintptr_t* copy = stride_copy(static_cast<std::uintptr_t*>(object), c);
    for (std::size_t i = 0; i < words; ++i) {
      // Read first: a region nobody touched stays unpopulated.
      if (__atomic_load_n(&copy[i], __ATOMIC_RELAXED) != 0) {
        __atomic_store_n(&copy[i], std::uintptr_t{0}, __ATOMIC_RELAXED);
      }
    }
  }
}

void* stride_arena::allocate() noexcept {
  if (void* object = pop_free()) return object;
  return take_unused();
}

// One popper at a time (the try-lock), so between reading the head and the
// CAS only pushes can change the list: the head we read is still on it, and
// its `next` is what it was. A busy try-lock means unused memory instead.
void* stride_arena::pop_free() noexcept {
  if (free_.load(std::memory_order_relaxed) == nullptr) return nullptr;
  if (popping_.exchange(1, std::memory_order_acquire) != 0) return nullptr;
  free_object* head = free_.load(std::memory_order_acquire);
  while (head != nullptr &&
         !free_.compare_exchange_weak(head, head->next, std::memory_order_acquire,
                                      std::memory_order_acquire)) {
  }
  popping_.store(0, std::memory_order_release);
  if (head == nullptr) return nullptr;
  head->next = nullptr;  // the link was CPU 0's first word: zero again
  return head;
}

// The next object of the current chunk; a new chunk when it is full (racing
// threads each map one, one installs it, the others unmap theirs).
void* stride_arena::take_unused() noexcept {
  const std::uint32_t per_chunk = static_cast<std::uint32_t>(objects_per_chunk());
  char* chunk = current_.load(std::memory_order_acquire);
  for (;;) {
    if (chunk != nullptr) {
      const std::uint32_t i =
          reinterpret_cast<chunk_header*>(chunk)->used.fetch_add(1, std::memory_order_relaxed);
      if (i < per_chunk) return chunk + kStrideHeader + i * size_;
    }
    char* fresh = map_chunk();
    if (fresh == nullptr) return nullptr;
    if (current_.compare_exchange_strong(chunk, fresh, std::memory_order_acq_rel,
                                         std::memory_order_acquire)) {
      chunk = fresh;
    } else {
      unmap_chunk(fresh);  // another thread installed one: `chunk` is it now
    }
  }
}

void stride_arena::deallocate(void* object, unsigned written) noexcept {
  if (object == nullptr) return;
  const unsigned all = regions();
  zero_every_copy(object, written < all ? written : all);
  free_object* node = static_cast<free_object*>(object);
  free_object* head = free_.load(std::memory_order_relaxed);
  do {
    node->next = head;
  } while (!free_.compare_exchange_weak(head, node, std::memory_order_release,
                                        std::memory_order_relaxed));
}

namespace {
stride_arena g_arenas[] = {stride_arena(16),  stride_arena(32),   stride_arena(64),
                           stride_arena(128), stride_arena(256),  stride_arena(512),
                           stride_arena(1024), stride_arena(2048), stride_arena(4096)};
}  // namespace

stride_arena& stride_arena_for(std::size_t object_size) noexcept {
  for (stride_arena& arena : g_arenas) {
    if (object_size <= arena.object_size()) return arena;
  }
  __builtin_trap();  // no structure asks for more (static_assert at each caller)
}

}  // namespace internal
}  // namespace percpu
