// Do not include directly; not a stable API (internal to percpu).
//
// Per-CPU memory laid out by stride: the memory every structure's per-CPU
// words live in, so an instance costs bytes per CPU, not a page.
//
// Layout
//   An arena hands out objects of one size. It maps chunks of max_cpus()
//   regions of kStride bytes each; an object is an offset in the chunk, and
//   CPU c's copy of it lives at offset + c * kStride. So the copies that one
//   CPU writes, of every object of the arena, sit together in that CPU's
//   region, and copies of two CPUs are kStride apart: never on one cache
//   line. A caller keeps CPU 0's address and reaches CPU c's copy with one
//   shift and add (copy()), which is what the structures' hot paths do.
//   Chunks are reserved (MAP_NORESERVE) and their pages fill on first touch,
//   so a CPU that never writes an object costs no memory: a process that
//   runs on 2 CPUs of a 4096-CPU host pays for 2. Readers that walk every
//   CPU's copy (a counter's load()) read untouched pages, which a stock
//   kernel maps to its shared zero page; on a kernel without a zero page
//   (some VM platforms' pvm_no_zero_page) such a read fills a page too.
//   The first 64 bytes of each region are the chunk's header (CPU 0's) or
//   unused (every other CPU's).
//
// Allocation and reuse
//   allocate() takes a freed object if it can, else the next unused one of
//   the current chunk, else maps a new chunk. Every copy of an object is zero
//   when allocate() returns it: fresh pages are, and deallocate() zeroes
//   every copy (reading first, so the regions of CPUs that never touched the
//   object stay unpopulated) before it puts the object on the free list.
//   - Async-signal-safe and lock-free: nothing waits. Pushing a freed object
//     is a CAS loop; popping one is done by one thread at a time, taken with
//     a try-lock, so a pop never meets the ABA case (only pushes race it).
//     A caller that finds the pop taken (another thread, or the code a
//     signal handler interrupted) allocates unused memory instead.
//   - A fork while another thread pops leaves that try-lock taken in the
//     child, whose arena then stops reusing freed objects (it still
//     allocates); so does a pop abandoned by a jump out of a signal handler.
//     Nothing is lost or handed out twice either way.
//   - When no chunk can be mapped, allocate() returns nullptr and keeps
//     errno; the callers have a path that needs no memory.
//   Chunks are never unmapped: freed objects are reused instead.
//
// What it takes from the three designs it was read against
//   librseq's rseq_mempool: the stride layout itself (one range per CPU, a
//   fixed power-of-two stride, 64 KiB, between a CPU's copy and the next
//   one's) and address space reserved ahead of use; not its policy of
//   populating every CPU's range when a pool is made.
//   The kernel's mm/percpu.c: chunks made of one unit per possible CPU,
//   populated only where used, and objects never moved once handed out.
//   tcmalloc's per-CPU slab: reaching a CPU's copy with a shift and an add
//   from one base, so a hot path needs no table.
//   Its own: reuse that zeroes a freed object by reading each copy first,
//   so a CPU that never ran keeps no page.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace percpu {
namespace internal {

// CPU c's copy of an object is c * kStride bytes after CPU 0's.
inline constexpr unsigned kStrideShift = 16;
inline constexpr std::size_t kStride = std::size_t{1} << kStrideShift;
// What a region holds before its first object (the chunk header).
inline constexpr std::size_t kStrideHeader = 64;

// CPU `cpu`'s copy of the object whose CPU 0 copy is `object`.
template <typename T>
inline T* stride_copy(T* object, unsigned cpu) noexcept {
  return reinterpret_cast<T*>(reinterpret_cast<std::uintptr_t>(object) +
                              (static_cast<std::uintptr_t>(cpu) << kStrideShift));
}

class stride_arena {
 public:
  // object_size: a multiple of 16, at most kStride - kStrideHeader.
  // regions: how many copies each object has; 0 for one per possible CPU
  // (max_cpus()). An arena of another count lays out words per thread
  // index the same way (one copy per index instead of per CPU).
  constexpr explicit stride_arena(std::size_t object_size, unsigned regions = 0) noexcept
      : size_(object_size), fixed_regions_(regions) {}
  stride_arena(const stride_arena&) = delete;
  stride_arena& operator=(const stride_arena&) = delete;

  // CPU 0's copy of an object whose every copy is zero, or nullptr when no
  // memory can be mapped. Needs start-up done (max_cpus() final).
  void* allocate() noexcept;
  // Zeroes every copy and keeps the object for reuse. Nobody may use it any
  // more, on any CPU. `written`: only copies below it can have been written
  // (the caller of a per-thread-index arena knows how many indexes were
  // handed out), so only those are read and zeroed; by default, every copy.
  static constexpr unsigned kEveryCopy = ~0u;
  void deallocate(void* object, unsigned written = kEveryCopy) noexcept;

  std::size_t object_size() const noexcept { return size_; }
  // Copies per object: CPU or thread slot c's is stride_copy(object, c).
  unsigned regions() const noexcept;
  // Objects that one chunk holds.
  std::size_t objects_per_chunk() const noexcept { return (kStride - kStrideHeader) / size_; }

 private:
  struct free_object {
    free_object* next;
  };
  void* pop_free() noexcept;
  void* take_unused() noexcept;

  char* map_chunk() const noexcept;
  void unmap_chunk(char* chunk) const noexcept;
  void zero_every_copy(void* object, unsigned copies) const noexcept;

  std::size_t size_;
  unsigned fixed_regions_;
  std::atomic<free_object*> free_{nullptr};
  std::atomic<int> popping_{0};  // the pop try-lock
  // The chunk objects are being carved from (its header counts them).
  std::atomic<char*> current_{nullptr};
};

// The process's arenas, one per size class (16, 32, ..., 4096 bytes): the
// smallest that holds `object_size`.
stride_arena& stride_arena_for(std::size_t object_size) noexcept;

}  // namespace internal
}  // namespace percpu
