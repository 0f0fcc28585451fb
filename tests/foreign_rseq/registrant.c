/* A test stand-in for another library that registers rseq before percpu
 * does, the way librseq, tcmalloc and others do when glibc has not. Built as
 * a shared library once per convention (tests/CMakeLists.txt), it registers
 * the loading thread from its constructor, and any other thread that calls
 * test_registrant_register().
 *
 *   REGISTRANT_LIBRSEQ   exports rseq_offset, rseq_size and rseq_flags, as
 *                        librseq does; registers max(feature size, 32) bytes
 *                        of a 64-byte, 64-aligned area
 *   REGISTRANT_ABI       defines the TLS symbol __rseq_abi, as tcmalloc and
 *                        older librseq do; registers the original 32 bytes
 *   REGISTRANT_HIDDEN    publishes nothing: percpu cannot find its area
 *   REGISTRANT_OTHERSIG  as REGISTRANT_LIBRSEQ, with a signature that is not
 *                        percpu's, so percpu may read but not run sections
 *
 * It only ever writes its area before registering it, as such libraries do.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/auxv.h>
#include <sys/syscall.h>
#include <unistd.h>

struct registrant_area {
  uint32_t cpu_id_start;
  int32_t cpu_id;
  uint64_t rseq_cs;
  uint32_t flags;
  int32_t node_id;
  int32_t mm_cid;
  uint32_t slice_ctrl;
  unsigned char tail[32];
} __attribute__((aligned(64)));

#if defined(__x86_64__)
#define COMMON_SIGNATURE 0x53053053u
#elif defined(__aarch64__)
#define COMMON_SIGNATURE 0xd428bc00u
#else
#define COMMON_SIGNATURE 0u
#endif

#define EXPORT __attribute__((visibility("default")))

#if defined(REGISTRANT_ABI)
EXPORT __thread struct registrant_area __rseq_abi
    __attribute__((tls_model("initial-exec"))) = {.cpu_id = -1};
#define AREA __rseq_abi
#else
static __thread struct registrant_area area
    __attribute__((tls_model("initial-exec"))) = {.cpu_id = -1};
#define AREA area
#endif

#if defined(REGISTRANT_LIBRSEQ) || defined(REGISTRANT_OTHERSIG)
EXPORT ptrdiff_t rseq_offset;
EXPORT unsigned int rseq_size;
EXPORT unsigned int rseq_flags;
#endif

#if defined(REGISTRANT_OTHERSIG)
#define SIGNATURE (COMMON_SIGNATURE ^ 0x01010101u)
#else
#define SIGNATURE COMMON_SIGNATURE
#endif

static unsigned registered_length(void) {
#if defined(REGISTRANT_ABI)
  return 32;
#else
  unsigned long feature = getauxval(27); /* AT_RSEQ_FEATURE_SIZE */
  unsigned long align = getauxval(28);   /* AT_RSEQ_ALIGN */
  if (feature <= 32 || feature > sizeof(struct registrant_area) || align > 64) return 32;
  return (unsigned)feature;
#endif
}

/* 0 when the calling thread is registered with this library's area, or the
 * errno of the failed attempt. */
EXPORT int test_registrant_register(void) {
  if (syscall(SYS_rseq, &AREA, registered_length(), 0, SIGNATURE) == 0) return 0;
  return errno;
}

EXPORT void* test_registrant_area(void) { return &AREA; }
EXPORT unsigned test_registrant_length(void) { return registered_length(); }

static int constructor_result = -1;
EXPORT int test_registrant_constructor_result(void) { return constructor_result; }

__attribute__((constructor)) static void register_loading_thread(void) {
  constructor_result = test_registrant_register();
#if defined(REGISTRANT_LIBRSEQ) || defined(REGISTRANT_OTHERSIG)
  if (constructor_result == 0) {
    rseq_offset = (char*)&AREA - (char*)__builtin_thread_pointer();
    rseq_size = registered_length();
    rseq_flags = 0;
  }
#endif
}
