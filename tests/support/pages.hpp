// Test helpers: how much of a range of memory has pages behind it, and how
// much anonymous memory the process has (also percpu-bench's memory table).
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdio>
#include <cstdint>
#include <set>
#include <vector>

#include "percpu/internal/stride_arena.hpp"

namespace percpu {
namespace test {

// Pages with a page table entry in [begin, begin + bytes) (mincore), or -1
// when part of the range is not mapped. A read of untouched anonymous memory
// maps the zero page on a stock kernel, which counts here too: measure
// before anything reads.
inline long present_pages(const void* begin, std::size_t bytes) {
  const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  const auto from = reinterpret_cast<std::uintptr_t>(begin) & ~(page - 1);
  const std::size_t pages =
      (reinterpret_cast<std::uintptr_t>(begin) + bytes - from + page - 1) / page;
  std::vector<unsigned char> vec(pages);
  if (mincore(reinterpret_cast<void*>(from), pages * page, vec.data()) != 0) return -1;
  long present = 0;
  for (unsigned char v : vec) present += v & 1;
  return present;
}

// Pages present in every CPU's copy (internal/stride_arena.hpp) of each
// page in `cpu0_pages` (CPU 0's pages, page-aligned), over CPUs
// [0, cpus); -1 when part of one is not mapped. Measure before anything
// reads them, as present_pages() says.
inline long present_stride_pages(const std::set<std::uintptr_t>& cpu0_pages, int cpus) {
  const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  long present = 0;
  for (std::uintptr_t p : cpu0_pages) {
    for (int cpu = 0; cpu < cpus; ++cpu) {
      const long pages = present_pages(
          internal::stride_copy(reinterpret_cast<char*>(p), static_cast<unsigned>(cpu)), page);
      if (pages < 0) return -1;
      present += pages;
    }
  }
  return present;
}

// The pages (page-aligned) that hold each of `words` but nullptr: where a
// set of structures keeps CPU 0's (or thread index 0's) copy of its words.
inline std::set<std::uintptr_t> pages_holding(const std::vector<const void*>& words) {
  const std::uintptr_t page = static_cast<std::uintptr_t>(sysconf(_SC_PAGESIZE));
  std::set<std::uintptr_t> pages;
  for (const void* w : words) {
    if (w != nullptr) pages.insert(reinterpret_cast<std::uintptr_t>(w) & ~(page - 1));
  }
  return pages;
}

// The resident anonymous bytes (smaps' "Anonymous:", which does not count
// the zero page) of the mappings that hold any of `addresses`: a structure's
// own chunks of per-CPU memory, apart from memory the rest of the process
// (a sanitizer's shadow of what was read, say) fills meanwhile. -1 if
// /proc/self/smaps cannot be read.
inline long anonymous_bytes_of_mappings(const std::set<std::uintptr_t>& addresses) {
  std::FILE* f = std::fopen("/proc/self/smaps", "r");
  if (f == nullptr) return -1;
  char line[512];
  bool holds = false;
  long kib_total = 0;
  while (std::fgets(line, sizeof(line), f) != nullptr) {
    unsigned long from = 0, to = 0;
    // A mapping's first line ("from-to perms ..."); the field lines never
    // parse as two numbers around a '-'.
    if (std::sscanf(line, "%lx-%lx ", &from, &to) == 2) {
      const auto at = addresses.lower_bound(from);
      holds = at != addresses.end() && *at < to;
      continue;
    }
    long kib = 0;
    if (holds && std::sscanf(line, "Anonymous: %ld kB", &kib) == 1) kib_total += kib;
  }
  std::fclose(f);
  return kib_total * 1024;
}

// The process's resident anonymous memory (heap, mappings, stacks; not the
// pages of its binaries, which running new code adds) in bytes, counted
// exactly: /proc/self/smaps_rollup walks the page tables, while
// /proc/self/statm reads counters the kernel updates in batches (off by up
// to a few hundred KiB). -1 if the file cannot be read (before Linux 4.14).
inline long resident_bytes() {
  std::FILE* f = std::fopen("/proc/self/smaps_rollup", "r");
  if (f == nullptr) return -1;
  char line[256];
  long kib = -1;
  while (std::fgets(line, sizeof(line), f) != nullptr) {
    if (std::sscanf(line, "Anonymous: %ld kB", &kib) == 1) break;
  }
  std::fclose(f);
  return kib < 0 ? -1 : kib * 1024;
}

}  // namespace test
}  // namespace percpu
