// Do not include directly; not a stable API (internal to percpu).
//
// The kernel's restartable-sequences ABI, as percpu relies on it.
//
// Declared here rather than taken from <linux/rseq.h> because distributions
// ship kernel headers older than the kernels they run: the fields node_id and
// mm_cid (Linux 6.3) are missing from many of them. Offsets are ABI and are
// pinned with static_assert below.
//
// Ownership rule: cpu_id_start, cpu_id, node_id and mm_cid belong to the
// kernel. percpu only ever reads them (Linux 7.1 kills a process that writes
// them). The one field user space writes is rseq_cs, and only the thread that
// owns the area writes it.
#pragma once

#include <cstddef>
#include <cstdint>

namespace percpu {
namespace internal {

// struct rseq_cs: describes one critical section to the kernel.
struct alignas(32) rseq_cs_descriptor {
  std::uint32_t version;             // always 0
  std::uint32_t flags;               // always 0: restart on preempt, signal and migration
  std::uint64_t start_ip;            // first instruction of the section
  std::uint64_t post_commit_offset;  // start_ip + this = first instruction after the commit
  std::uint64_t abort_ip;            // handler; RSEQ_SIG sits in the 4 bytes before it
};
static_assert(sizeof(rseq_cs_descriptor) == 32, "struct rseq_cs is 32 bytes");
static_assert(offsetof(rseq_cs_descriptor, start_ip) == 8, "rseq_cs ABI");
static_assert(offsetof(rseq_cs_descriptor, post_commit_offset) == 16, "rseq_cs ABI");
static_assert(offsetof(rseq_cs_descriptor, abort_ip) == 24, "rseq_cs ABI");

// struct rseq: the per-thread area the kernel keeps current.
struct alignas(32) rseq_area {
  std::uint32_t cpu_id_start;  // kernel-written; always a valid CPU id
  std::int32_t cpu_id;         // kernel-written; negative until registered
  std::uint64_t rseq_cs;       // user-written: the active descriptor, or 0
  std::uint32_t flags;         // deprecated by the kernel; left 0
  std::int32_t node_id;        // kernel-written (feature size >= 24)
  std::int32_t mm_cid;         // kernel-written (feature size >= 28)
};
static_assert(offsetof(rseq_area, cpu_id_start) == 0, "rseq ABI");
static_assert(offsetof(rseq_area, cpu_id) == 4, "rseq ABI");
static_assert(offsetof(rseq_area, rseq_cs) == 8, "rseq ABI");
static_assert(offsetof(rseq_area, flags) == 16, "rseq ABI");
static_assert(offsetof(rseq_area, node_id) == 20, "rseq ABI");
static_assert(offsetof(rseq_area, mm_cid) == 24, "rseq ABI");
static_assert(sizeof(rseq_area) == 32, "registered length is the original 32 bytes");
static_assert(alignof(rseq_area) == 32, "the kernel rejects a misaligned area");

constexpr std::ptrdiff_t kCpuIdStartOffset = offsetof(rseq_area, cpu_id_start);
constexpr std::ptrdiff_t kCpuIdOffset = offsetof(rseq_area, cpu_id);
constexpr std::ptrdiff_t kRseqCsOffset = offsetof(rseq_area, rseq_cs);
constexpr std::ptrdiff_t kNodeIdOffset = offsetof(rseq_area, node_id);
constexpr std::ptrdiff_t kMmCidOffset = offsetof(rseq_area, mm_cid);

// Feature sizes: how much of the area the kernel keeps current.
constexpr unsigned kFeatureSizeOriginal = 20;  // up to and including flags
constexpr unsigned kFeatureSizeNodeId = 24;
constexpr unsigned kFeatureSizeMmCid = 28;

// The original length: every kernel accepts it (with 32-byte alignment), and
// from Linux 7.0 on it selects the legacy mode.
constexpr unsigned kRegisteredLength = 32;

// percpu's own area: room for a registration longer than 32 bytes, which
// Linux 7.0+ accepts only 64-byte aligned and answers with its strict (V2)
// mode. The tail belongs to the kernel as much as the rest: percpu never
// writes any of it.
struct alignas(64) own_rseq_area {
  rseq_area area;
  unsigned char tail[32];
};
static_assert(sizeof(own_rseq_area) == 64 && alignof(own_rseq_area) == 64,
              "room and alignment for a V2 registration");
static_assert(offsetof(own_rseq_area, area) == 0, "the kernel sees struct rseq at the start");

// Registration flags (sys_rseq's third argument).
constexpr int kRseqFlagUnregister = 1;

constexpr int kCpuIdUninitialized = -1;
constexpr int kCpuIdRegistrationFailed = -2;

// Auxiliary-vector tags (Linux 6.3); absent tags read as 0.
constexpr unsigned long kAtRseqFeatureSize = 27;
constexpr unsigned long kAtRseqAlign = 28;

// The signature the kernel checks in the 4 bytes before every abort handler.
// Each value is an instruction that traps, so falling into the signature by
// accident cannot run on silently.
#if defined(__x86_64__)
constexpr std::uint32_t kRseqSignature =
    0x53053053;  // the disp32 of a ud1 (see rseq_cs_x86_64.hpp)
#define PERCPU_RSEQ_SIG_STRING "0x53053053"
#elif defined(__aarch64__)
constexpr std::uint32_t kRseqSignature = 0xd428bc00;  // brk #0x45e0
#define PERCPU_RSEQ_SIG_STRING "0xd428bc00"
#endif

}  // namespace internal
}  // namespace percpu
