// Registration: how percpu decides who serves cpu_id(), registers threads,
// and answers the slow paths (see percpu/internal/registration.hpp).
//
// Start-up (a priority-101 constructor, so before ordinary constructors):
//   1. If glibc registered rseq (its __rseq_size is non-zero), the fast path
//      reads glibc's area at __rseq_offset from the thread pointer. Both
//      symbols are looked up with dlsym, so the library has no hard
//      dependency on GLIBC_2.35 and loads on older glibc.
//   2. Otherwise, on an architecture whose signature percpu knows, the fast
//      path reads percpu's own static-TLS area. Each thread registers it on its
//      first slow-path call; until then its cpu_id holds -1.
//      A thread that another library registered first (percpu's attempt
//      fails with EINVAL) shares that library's area if a published
//      convention finds it (librseq's rseq_offset/rseq_size, or a
//      __rseq_abi TLS symbol as tcmalloc and older librseq define) and the
//      kernel confirms it is the thread's registration; that thread only.
//   3. A fallback (RDPID, vDSO, syscall) is chosen once, for threads whose
//      registration fails and for PERCPU_BACKEND=rdpid|vdso|syscall.
//   4. On arm64 kernels that lost the abort on same-CPU preemption the
//      structures take their no-rseq paths (PERCPU_RSEQ_SECTIONS overrides).
// Every fast-path offset points into static TLS, so the same offset is right
// for every thread, including threads that existed before the first call.

#include "percpu/internal/registration.hpp"

#include <dlfcn.h>
#include <link.h>
#include <sys/auxv.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>

#include "percpu/cpu.hpp"
#include "percpu/internal/config.hpp"
#include "percpu/internal/environment.hpp"
#include "percpu/internal/fallback.hpp"
#include "percpu/internal/nocancel.hpp"
#include "percpu/internal/rseq_abi.hpp"
#include "percpu/internal/sysfs.hpp"

// glibc 2.35+ defines these; weak, so linking works against any glibc and a
// missing definition reads as a null address. (In a dynamic link the version
// reference they create is weak too: the library still loads on older glibc.)
extern "C" {
extern const unsigned int __rseq_size __attribute__((weak));
extern const std::ptrdiff_t __rseq_offset __attribute__((weak));
// librseq's convention for where a thread's area is, in static programs
// (dynamic ones are asked through dlsym).
extern const std::ptrdiff_t rseq_offset __attribute__((weak));
extern const unsigned int rseq_size __attribute__((weak));
}

// ---- Before start-up: the id offsets aimed at the unregistered area --------
//
// Where percpu has rseq, the inline id paths accept any value that is not
// negative (see fast_path_offsets in cpu.hpp), so from the very first call
// of the process their offsets must lead to a word that holds -1. The
// offset of unregistered_area from the thread pointer is known only once
// the dynamic linker has placed percpu's static TLS, so it is stored by the
// resolver of an indirect function, before_startup, whose address
// g_fast_path holds: the dynamic linker (or, in a static program, the C
// library's start) runs that resolver while it relocates the object that
// holds g_fast_path. Every linker puts that relocation (IRELATIVE) after
// the one that fills the TLS offset's GOT slot, and glibc applies IRELATIVE
// relocations after an object's others in any case; no constructor and no
// code of the program can run before. The resolver reads the offset from
// that GOT slot (a static link puts it in the instruction), never through
// the thread pointer, which a static program may not have set up yet. It
// runs before any sanitizer's runtime, so it is not instrumented, and it
// stores with plain instructions of its own. It stores into g_fast_path
// both under its exported name, which a program that copied the variable
// (a copy relocation) resolves to the program's copy, and under a hidden
// alias, this library's own copy, which the program's copy relocation, run
// later, copies from.
#if defined(__x86_64__) || defined(__aarch64__)
#if defined(__clang__)
#define PERCPU_UNINSTRUMENTED \
  __attribute__((no_sanitize("address", "thread", "memory", "undefined", "hwaddress")))
#else
#define PERCPU_UNINSTRUMENTED \
  __attribute__((no_sanitize_address, no_sanitize_thread, no_sanitize_undefined))
#endif

extern "C" {
PERCPU_UNINSTRUMENTED static void percpu_internal_before_startup_target() {}

PERCPU_UNINSTRUMENTED static void store_word(std::intptr_t* at, std::intptr_t value) {
#if defined(__x86_64__)
  asm volatile("movq %1, (%0)" : : "r"(at), "r"(value) : "memory");
#else
  asm volatile("str %1, [%0]" : : "r"(at), "r"(value) : "memory");
#endif
}

__attribute__((used, visibility("hidden"))) PERCPU_UNINSTRUMENTED void (*percpu_internal_before_startup_resolver())() {
  std::intptr_t base;
#if defined(__x86_64__)
  asm("movq percpu_internal_unregistered_area@gottpoff(%%rip), %0" : "=r"(base));
#else
  asm("adrp %0, :gottprel:percpu_internal_unregistered_area\n\t"
      "ldr %0, [%0, #:gottprel_lo12:percpu_internal_unregistered_area]"
      : "=r"(base));
#endif
  // Written out, no loop and no library code: nothing here may call code a
  // sanitizer instruments, whose runtime is not up yet.
  extern percpu::internal::fast_path_offsets percpu_internal_g_fast_path_here;
  percpu::internal::fast_path_offsets* const here = &percpu_internal_g_fast_path_here;
  percpu::internal::fast_path_offsets* const exported = &percpu::internal::g_fast_path;
  store_word(&here->cpu_id, base + percpu::internal::kCpuIdOffset);
  store_word(&here->node_id, base + percpu::internal::kNodeIdOffset);
  store_word(&here->concurrency_id, base + percpu::internal::kCpuIdOffset);
  store_word(&here->sections_area, base);
  store_word(&exported->cpu_id, base + percpu::internal::kCpuIdOffset);
  store_word(&exported->node_id, base + percpu::internal::kNodeIdOffset);
  store_word(&exported->concurrency_id, base + percpu::internal::kCpuIdOffset);
  store_word(&exported->sections_area, base);
  return percpu_internal_before_startup_target;
}

__attribute__((ifunc("percpu_internal_before_startup_resolver"), visibility("hidden"))) void
percpu_internal_before_startup();
}  // extern "C"
#define PERCPU_BEFORE_STARTUP &percpu_internal_before_startup
#else
#define PERCPU_BEFORE_STARTUP nullptr
#endif

namespace percpu {
namespace internal {

// Statically initialised. Its id offsets are 0 only until the relocation
// of before_startup (above) aims them at the unregistered area; elsewhere
// they stay 0 until start-up, and the bounds reject every load until then.
fast_path_offsets g_fast_path = {0, 0, 0, 0, 0, 0, 0, 0, PERCPU_BEFORE_STARTUP, false};

}  // namespace internal
}  // namespace percpu

// This library's own g_fast_path, whatever a program's copy relocation
// makes of the exported name (see before_startup above).
extern "C" percpu::internal::fast_path_offsets percpu_internal_g_fast_path_here
    __attribute__((alias("_ZN6percpu8internal11g_fast_pathE"), visibility("hidden")));

namespace percpu {
namespace internal {

namespace {

// shared: another library registered the thread first, and percpu reads
// (and, with the same signature, runs sections on) that library's area.
enum class thread_registration : int { untried, trying, registered, shared, failed };

// Static TLS (PERCPU_STATIC_TLS), so each variable sits at one fixed offset
// from the thread pointer in every thread, and a signal handler can touch it.
// The kernel-owned fields hold -1 until the kernel writes them; that value is
// only the initial image, never a store.
__thread own_rseq_area own_area PERCPU_STATIC_TLS = {{0, kCpuIdUninitialized, 0, 0, -1, -1}, {}};
// Never registered: the fast path lands here before start-up and when a
// fallback is forced. Named for the assembler, for before_startup's resolver.
__thread rseq_area unregistered_area __asm__("percpu_internal_unregistered_area")
    PERCPU_STATIC_TLS = {0, kCpuIdUninitialized, 0, 0, -1, -1};
__thread thread_registration registration PERCPU_STATIC_TLS = thread_registration::untried;
__thread int registration_error PERCPU_STATIC_TLS = 0;
// Another library's area this thread shares (thread_registration::shared),
// the length it is registered with, and whether its signature is percpu's.
__thread rseq_area* shared_area PERCPU_STATIC_TLS = nullptr;
__thread unsigned shared_length PERCPU_STATIC_TLS = 0;
__thread bool shared_sections PERCPU_STATIC_TLS = false;

}  // namespace

__thread section_user t_section_state PERCPU_STATIC_TLS = section_user::unmarked;
int g_section_users = 0;

namespace {

// What PERCPU_BACKEND or force_backend() asked for: nothing, or a backend
// (the same values as cpu_backend, so one converts to the other).
enum class forced_backend : int { none = -1, rseq, rdpid, vdso, syscall };
static_assert(static_cast<int>(forced_backend::syscall) == static_cast<int>(cpu_backend::syscall),
              "forced_backend mirrors cpu_backend");

forced_backend as_forced(cpu_backend backend) {
  return static_cast<forced_backend>(static_cast<int>(backend));
}

struct process_state {
  // Who registers threads. Drops from percpu to none, once, when the kernel
  // turns out to have no rseq at all, so later threads skip the attempt. A
  // failure that may be the thread's own (a per-thread seccomp filter, an
  // area another library registered) only ever concerns that thread.
  std::atomic<rseq_owner> owner{rseq_owner::none};
  std::intptr_t natural_area = 0;           // the area rseq would serve from
  unsigned feature_size = 0;                // bytes the kernel keeps current
  unsigned own_length = kRegisteredLength;  // what percpu registers its area with
  // What start-up decided for the whole process: on, or why the structures
  // take their no-rseq paths everywhere (sections_status()).
  sections sections_decision = sections::on;
  // Start-up has opened the fast path (open_fast_path()): from then on the
  // sections' area may lead to a registered area.
  bool fast_path_open = false;
  // Other registrants' conventions, resolved at start-up (dlsym is not
  // async-signal-safe, and registration may run in a signal handler): the
  // address of librseq's rseq_offset and rseq_size, and the thread-pointer
  // offset of a __rseq_abi in static TLS.
  const std::ptrdiff_t* librseq_offset = nullptr;
  const unsigned* librseq_size = nullptr;
  bool have_rseq_abi = false;
  std::intptr_t rseq_abi_offset = 0;
  // librseq's area, once a thread found it registered (see
  // serve_other_area()): its thread-pointer offset (0: none), the length it
  // is registered with, and whether its signature is percpu's. Written once,
  // offset last.
  std::atomic<std::intptr_t> other_area{0};
  unsigned other_length = 0;
  bool other_sections = false;
  cpu_backend fallback = cpu_backend::syscall;
  vdso_getcpu_fn vdso_getcpu = nullptr;          // cached for the vdso fallback
  forced_backend forced = forced_backend::none;  // PERCPU_BACKEND, force_backend()
  std::atomic<bool> forced_rseq_warned{false};
};
process_state g_state;

std::intptr_t tp_offset_of(const void* tls_object) {
  return static_cast<const char*>(tls_object) - thread_pointer();
}

// One line on stderr, written with a single write(2): usable in a signal
// handler and before main, and never interleaved with other threads' lines.
void say(std::initializer_list<const char*> parts) noexcept {
  char line[320];
  std::size_t n = 0;
  for (const char* part : {"percpu: "}) {
    for (; *part != '\0' && n < sizeof(line) - 1; ++part) line[n++] = *part;
  }
  for (const char* part : parts) {
    for (; *part != '\0' && n < sizeof(line) - 1; ++part) line[n++] = *part;
  }
  line[n++] = '\n';
  nocancel_write(STDERR_FILENO, line, n);
}

forced_backend parse_backend(const char* name) {
  for (cpu_backend b :
       {cpu_backend::rseq, cpu_backend::rdpid, cpu_backend::vdso, cpu_backend::syscall}) {
    if (std::strcmp(name, to_string(b)) == 0) return as_forced(b);
  }
  return forced_backend::none;
}

const char* errno_name(int error) noexcept {
  switch (error) {
    case ENOSYS: return "ENOSYS";
    case EPERM: return "EPERM";
    case EINVAL: return "EINVAL";
    case EBUSY: return "EBUSY";
    case EFAULT: return "EFAULT";
    default: return "an error";
  }
}

// The first usable fallback at or after `first` in the order rdpid, vdso,
// syscall. A forced choice that is unusable says so, once, on stderr.
cpu_backend choose_fallback(cpu_backend first, bool forced) {
  const cpu_backend order[] = {cpu_backend::rdpid, cpu_backend::vdso, cpu_backend::syscall};
  const char* first_failure = nullptr;
  cpu_backend chosen = cpu_backend::syscall;
  bool started = false;
  for (cpu_backend b : order) {
    started = started || b == first;
    if (!started) continue;
    const char* why = nullptr;
    if (fallback_usable(b, &why)) {
      chosen = b;
      break;
    }
    if (first_failure == nullptr) first_failure = why;
  }
  if (forced && chosen != first) {
    say({"PERCPU_BACKEND=", to_string(first), " is unavailable here (",
         first_failure != nullptr ? first_failure : "unknown reason", "); using ",
         to_string(chosen)});
  }
  return chosen;
}

// Whether the inline id paths may read the kernel's ids: they accept any id
// that is not negative (cpu.hpp), so max_cpus() must bound every id the
// kernel reports. Where start-up cannot prove that, they read the
// unregistered area, and the slow path answers every call, folding ids into
// range (within_max_cpus below).
bool inline_ids_need_no_bound() noexcept {
  return !kArchHasRseq || max_cpus_bounds_every_id();
}

// Aims the structures' sections (fast_path_offsets::sections_area) at the
// serving area where they run sections in this process and its ids need no
// bound (a section's index, cpu_id_start, is never tested against one), at
// the unregistered area otherwise: there every section aborts, and the
// structures' slow paths decide. Until start-up has opened the fast path it
// stays at the unregistered area, where before_startup's resolver put it.
//
// The started hot paths (rseq_cs.hpp, start_section()) test only the
// started area's cpu_id before their section, not whether the thread has
// counted itself, so the section users count (registration.hpp) must already
// count every thread that can commit one on the area aimed at. Threads of
// glibc's or a served library's area are registered without percpu, so
// start-up counts them, once, before the store; each of percpu's own
// registrations counts itself (register_this_thread()). A started section
// reaches the head through the offset it loads here (an address dependency
// on aarch64, program order on x86-64), so it cannot read the head before
// the count and its fence.
void aim_sections() {
  const bool on = g_state.fast_path_open && g_state.sections_decision == sections::on &&
                  inline_ids_need_no_bound();
  const std::intptr_t area = __atomic_load_n(&g_fast_path.area, __ATOMIC_RELAXED);
  // Neither percpu's own area (counted per registration) nor the
  // unregistered one (no section commits there).
  const bool registered_by_others =
      area != tp_offset_of(&own_area) && area != tp_offset_of(&unregistered_area);
  static std::atomic<bool> counted{false};
  if (on && registered_by_others && !counted.exchange(true)) add_section_users(1);
  __atomic_store_n(&g_fast_path.sections_area, on ? area : tp_offset_of(&unregistered_area),
                   __ATOMIC_RELEASE);
}

// Points the fast path at an area: reads of cpu_id, node_id and mm_cid go
// there when the kernel fills them (and inline_ids_need_no_bound()), and to a
// word that is always -1 (which sends the caller to the slow path) when not.
void aim_fast_path(std::intptr_t area, unsigned feature_size) {
  const std::intptr_t unregistered = tp_offset_of(&unregistered_area);
  const std::intptr_t ids = inline_ids_need_no_bound() ? area : unregistered;
  g_fast_path.area = area;
  g_fast_path.cpu_id = ids + kCpuIdOffset;
  g_fast_path.node_id =
      feature_size >= kFeatureSizeNodeId ? ids + kNodeIdOffset : unregistered + kNodeIdOffset;
  g_fast_path.concurrency_id =
      feature_size >= kFeatureSizeMmCid ? ids + kMmCidOffset : ids + kCpuIdOffset;
  aim_sections();
}

// The last step of start-up: the bounds that let the fast paths accept what
// they load, then the sections' area. Stored after every offset, with
// release order, so a reader that sees them was handed offsets that are set.
void open_fast_path() {
  g_fast_path.section_state = tp_offset_of(&t_section_state);
  const auto limit = static_cast<std::uint32_t>(max_cpus());
  __atomic_store_n(&g_fast_path.node_limit, 0x80000000u, __ATOMIC_RELEASE);
  __atomic_store_n(&g_fast_path.cpu_limit, limit, __ATOMIC_RELEASE);
  g_state.fast_path_open = true;
  aim_sections();
}

// Every change of owner or fallback goes through here, so the inline RDPID
// shortcut never skips a registration that is still due.
// RDPID's CPU is bounded by nothing inline either, so the shortcut needs the
// same proof as the inline ids (inline_ids_need_no_bound()).
void set_owner_and_fallback(rseq_owner owner, cpu_backend fallback) {
  g_state.fallback = fallback;
  g_state.owner.store(owner, std::memory_order_relaxed);
  g_fast_path.rdpid_inline = fallback == cpu_backend::rdpid && owner != rseq_owner::percpu &&
                             inline_ids_need_no_bound();
}

void set_owner(rseq_owner owner) { set_owner_and_fallback(owner, g_state.fallback); }

void aim_at_fallback() { aim_fast_path(tp_offset_of(&unregistered_area), 0); }

}  // namespace

bool glibc_registered_rseq(std::intptr_t* area, unsigned* size_out) noexcept {
  // Dynamic programs: ask the loader, so nothing here needs GLIBC_2.35.
  const auto* size = static_cast<const unsigned*>(dlsym(RTLD_DEFAULT, "__rseq_size"));
  const auto* offset = static_cast<const std::ptrdiff_t*>(dlsym(RTLD_DEFAULT, "__rseq_offset"));
  // Static programs have no dynamic symbol table to ask; there the weak
  // references resolve at link time, to glibc's variables or to null.
  if (size == nullptr || offset == nullptr) {
    size = &__rseq_size != nullptr ? &__rseq_size : nullptr;
    offset = &__rseq_offset != nullptr ? &__rseq_offset : nullptr;
  }
  if (size == nullptr || offset == nullptr || *size == 0) return false;
  if (area != nullptr) *area = *offset;
  if (size_out != nullptr) *size_out = *size;
  return true;
}

namespace {

// addresses are taken here; the values are read when a thread needs them,
// since such a library may set them in a constructor that runs after this.
void find_other_registrants() {
  g_state.librseq_offset = static_cast<const std::ptrdiff_t*>(dlsym(RTLD_DEFAULT, "rseq_offset"));
  g_state.librseq_size = static_cast<const unsigned*>(dlsym(RTLD_DEFAULT, "rseq_size"));
  if (g_state.librseq_offset == nullptr || g_state.librseq_size == nullptr) {
    g_state.librseq_offset = &rseq_offset != nullptr ? &rseq_offset : nullptr;
    g_state.librseq_size = &rseq_size != nullptr ? &rseq_size : nullptr;
  }
  // A TLS symbol: dlsym answers with this thread's instance. Its offset from
  // the thread pointer is every thread's when the defining object sits in
  // static TLS; when it does not, the kernel's check in adopt_other_area()
  // refuses the other threads' guesses, and they fall back.
  if (void* abi = dlsym(RTLD_DEFAULT, "__rseq_abi")) {
    g_state.have_rseq_abi = true;
    g_state.rseq_abi_offset = tp_offset_of(abi);
  }
}

// PERCPU_RSEQ_SECTIONS=on|off, or the kernel check (sections_decision_for()),
// saying on stderr what it ignored or turned off.
sections decide_sections() {
  char value[8];
  const char* forced = startup_env("PERCPU_RSEQ_SECTIONS", value, sizeof(value));
  if (forced != nullptr && std::strcmp(forced, "on") != 0 && std::strcmp(forced, "off") != 0) {
    say({"PERCPU_RSEQ_SECTIONS=", forced, " is not on or off; ignoring it"});
  }
  struct utsname name;
  const bool named = uname(&name) == 0;
  const sections decision =
      sections_decision_for(forced, named ? name.machine : nullptr, named ? name.release : nullptr);
  if (decision == sections::kernel_quirk && !secure_execution()) {
    say({"Linux ", name.release, " on ", name.machine,
         " may not abort rseq critical sections on same-CPU preemption; per-CPU "
         "structures use their no-rseq paths (PERCPU_RSEQ_SECTIONS=on overrides)"});
  }
  return decision;
}

void initialize_once() {
  const unsigned long auxv_feature_size = getauxval(kAtRseqFeatureSize);
  // Kernels before 6.3 have no AT_RSEQ_FEATURE_SIZE; they fill the original 20 bytes.
  g_state.feature_size =
      auxv_feature_size != 0 ? static_cast<unsigned>(auxv_feature_size) : kFeatureSizeOriginal;
  g_state.own_length = own_registration_length_for(auxv_feature_size, getauxval(kAtRseqAlign));
  g_state.sections_decision = kArchHasRseq ? decide_sections() : sections::unsupported_arch;

  char backend_name[32];
  const char* requested = startup_env("PERCPU_BACKEND", backend_name, sizeof(backend_name));
  if (requested != nullptr && *requested != '\0') {
    g_state.forced = parse_backend(requested);
    if (g_state.forced == forced_backend::none) {
      say({"PERCPU_BACKEND=", requested, " is not one of rseq, rdpid, vdso, syscall; ignoring it"});
    }
  }

  const bool forced_fallback =
      g_state.forced != forced_backend::none && g_state.forced != forced_backend::rseq;
  g_state.fallback = choose_fallback(
      forced_fallback ? static_cast<cpu_backend>(g_state.forced) : cpu_backend::rdpid,
      forced_fallback);
  g_state.vdso_getcpu = vdso_getcpu_function();
  std::intptr_t area = 0;
  if (glibc_registered_rseq(&area)) {
    set_owner(rseq_owner::glibc);
  } else if (kArchHasRseq) {
    set_owner(rseq_owner::percpu);
    area = tp_offset_of(&own_area);
    find_other_registrants();
  } else {
    set_owner(rseq_owner::none);
    area = tp_offset_of(&unregistered_area);
    if (g_state.forced == forced_backend::rseq) {
      say(
          {"PERCPU_BACKEND=rseq is unavailable here (no rseq support for this architecture); "
           "using ",
           to_string(g_state.fallback)});
    }
  }
  g_state.natural_area = area;

  if (forced_fallback) {
    if (g_state.owner.load() == rseq_owner::percpu) set_owner(rseq_owner::none);
    aim_at_fallback();
  } else {
    aim_fast_path(area, g_state.feature_size);
  }
  open_fast_path();
}

// Keeps the object that holds this code loaded for the rest of the process.
// A plugin that links percpu statically and is dlclose'd would otherwise take
// with it what the kernel still uses on every thread it touched: critical
// section descriptors an area's rseq_cs may still point at, and (when percpu
// registered) the static-TLS areas themselves. A no-op for the main program.
// Not async-signal-safe (dlopen), so it runs from the constructor only; code
// that runs before the constructor is still pinned when the constructor
// runs, before the object can be unloaded.
void pin_this_object() noexcept {
  static const char anchor = 0;
  pin_object_containing(&anchor);
}

__attribute__((constructor(101))) void initialize_at_load() {
  (void)ensure_initialized();
  pin_this_object();
}

}  // namespace

namespace {

// The address range of a loaded object: from its lowest to the end of its
// highest PT_LOAD segment.
struct object_range {
  std::uintptr_t start = 0, end = 0;
  bool holds(std::uintptr_t address) const noexcept { return start <= address && address < end; }
};

// Objects pin_object_containing() needs to do nothing more for: the main
// program, and the object it pinned last. Neither is ever unloaded, so no
// other object can come to lie in their ranges. Under a spin lock (held for
// a few loads or stores only, never across a call into the loader); all
// constant-initialised, so usable before any constructor.
std::atomic<bool> g_pin_cache_locked{false};
object_range g_main_program_range, g_last_pinned_range;

class pin_cache_guard {
 public:
  pin_cache_guard() noexcept {
    while (g_pin_cache_locked.exchange(true, std::memory_order_acquire)) {
    }
  }
  ~pin_cache_guard() { g_pin_cache_locked.store(false, std::memory_order_release); }
  pin_cache_guard(const pin_cache_guard&) = delete;
  pin_cache_guard& operator=(const pin_cache_guard&) = delete;
};

// What find_object() looks for and finds. dl_iterate_phdr shows the main
// program first (glibc and musl, static programs too).
struct object_search {
  explicit object_search(std::uintptr_t a) noexcept : address(a) {}
  std::uintptr_t address;
  int index = 0;  // of the object dl_iterate_phdr shows next
  bool found = false, main_program = false;
  object_range range;
  const char* name = nullptr;
};

int find_object(dl_phdr_info* info, std::size_t, void* data) noexcept {
  auto* search = static_cast<object_search*>(data);
  const bool first = search->index++ == 0;
  object_range range{UINTPTR_MAX, 0};
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& segment = info->dlpi_phdr[i];
    if (segment.p_type != PT_LOAD) continue;
    const std::uintptr_t begin = info->dlpi_addr + segment.p_vaddr;
    if (begin < range.start) range.start = begin;
    if (begin + segment.p_memsz > range.end) range.end = begin + segment.p_memsz;
  }
  if (!range.holds(search->address)) return 0;
  search->found = true;
  search->main_program = first;
  search->range = range;
  search->name = info->dlpi_name;
  return 1;
}

}  // namespace

// dl_iterate_phdr rather than dladdr: dladdr also looks for the nearest
// symbol, a walk over the object's whole symbol table, and names the main
// program after argv[0], which dlopen cannot find.
void pin_object_containing(const void* address) noexcept {
  const auto where = reinterpret_cast<std::uintptr_t>(address);
  {
    pin_cache_guard guard;
    if (g_main_program_range.holds(where) || g_last_pinned_range.holds(where)) return;
  }
  const int saved_errno = errno;
  object_search search(where);
  dl_iterate_phdr(find_object, &search);
  if (search.found && search.main_program) {
    pin_cache_guard guard;
    g_main_program_range = search.range;
  } else if (search.found && search.name != nullptr && search.name[0] != '\0') {
    // RTLD_NOLOAD: only ever a reference to the object already loaded (even
    // while its own constructors run); the handle is kept for good.
    if (dlopen(search.name, RTLD_LAZY | RTLD_NOLOAD | RTLD_NODELETE) != nullptr) {
      pin_cache_guard guard;
      g_last_pinned_range = search.range;
    }
  }
  // Not found (a static program without the loader's list): nothing is
  // loaded that could be unloaded.
  errno = saved_errno;
}

// Normally the constructor has run before anyone asks. Code that runs earlier
// (another library's constructor, an allocator called during start-up) gets
// here through a slow path or the C API; a caller that interrupts the
// initialisation itself (a signal handler) is told to use the system call.
std::atomic<int> g_init_state{kInitNotStarted};

bool initialize_now() noexcept {
  int expected = kInitNotStarted;
  if (g_init_state.compare_exchange_strong(expected, kInitRunning, std::memory_order_acq_rel)) {
    initialize_once();
    g_init_state.store(kInitDone, std::memory_order_release);
    return true;
  }
  return g_init_state.load(std::memory_order_acquire) == kInitDone;
}

namespace {

// Whether an ENOSYS from rseq may mean the kernel has none, rather than a
// seccomp filter on one thread: only when nothing shows that it has rseq (a
// kernel with rseq puts AT_RSEQ_FEATURE_SIZE in the auxiliary vector from
// Linux 6.3 on) and no thread of this process has registered yet. Anything
// else makes the failure the thread's own, and threads created later still
// try.
std::atomic<bool> g_some_thread_registered{false};
bool kernel_may_lack_rseq() noexcept {
  return getauxval(kAtRseqFeatureSize) == 0 &&
         !g_some_thread_registered.load(std::memory_order_relaxed);
}

// Whether `area`, found through another library's convention, is the area
// the kernel has registered for the calling thread: asking the kernel to
// register it again with the same length answers EBUSY when the signature is
// percpu's too, EPERM when it differs, and EINVAL for any other area or
// length. Nothing changes in either case. Sets the length it matched and
// whether percpu's sections may run on it.
bool kernel_confirms(rseq_area* area, unsigned hint_length, unsigned* length,
                     bool* same_signature) {
  const unsigned lengths[] = {hint_length, kRegisteredLength, g_state.own_length};
  for (unsigned candidate : lengths) {
    if (candidate < kRegisteredLength) continue;
    const long rc = syscall(SYS_rseq, area, candidate, 0, kRseqSignature);
    if (rc == 0) {
      // Nobody had registered this thread after all (it cannot happen after
      // the EINVAL that brought us here, unless a signal handler unregistered
      // in between): leave it as it was.
      syscall(SYS_rseq, area, candidate, kRseqFlagUnregister, kRseqSignature);
      return false;
    }
    if (errno == EBUSY || errno == EPERM) {
      *length = candidate;
      *same_signature = errno == EBUSY;
      return true;
    }
  }
  return false;
}

// Whether `area` shows the CPU getcpu reports: a few tries, since the thread
// may migrate between the two reads.
bool shows_current_cpu(const rseq_area* area) {
  for (int attempt = 0; attempt < 4; ++attempt) {
    const int before = *reinterpret_cast<volatile const std::int32_t*>(&area->cpu_id);
    unsigned cpu = 0;
    if (raw_syscall_getcpu(&cpu, nullptr) != 0) return false;
    const int after = *reinterpret_cast<volatile const std::int32_t*>(&area->cpu_id);
    if (before >= 0 && before == after && static_cast<unsigned>(before) == cpu) return true;
  }
  return false;
}

// The inline paths read librseq's area from then on, as they read glibc's:
// librseq publishes, in rseq_offset, the thread-pointer offset of an area in
// static TLS, the same in every thread, and the kernel keeps its cpu_id at -1
// on the threads librseq has not registered (or unregistered), so the inline
// check sends those threads to the slow path, which serves them from
// percpu's own registration as before. Sections read their area the same
// way, so the area is aimed at only when its signature is percpu's; with
// another signature only cpu_id() reads it, and sections stay off on its
// threads (the slow path decides, from percpu's own, unregistered, area).
// node_id() and concurrency_id() keep their paths: the kernel leaves those
// fields of an unregistered area at 0, which the inline check would accept.
// A __rseq_abi found by dlsym is not aimed at: nothing says it sits in
// static TLS for every thread. Once per process; later calls do nothing.
void serve_other_area(std::intptr_t offset, unsigned length, bool same_signature) noexcept {
  if (__atomic_load_n(&g_fast_path.area, __ATOMIC_RELAXED) != tp_offset_of(&own_area)) return;
  static std::atomic<bool> claimed{false};
  if (claimed.exchange(true, std::memory_order_acq_rel)) return;
  g_state.other_length = length;
  g_state.other_sections = same_signature;
  g_state.other_area.store(offset, std::memory_order_release);
  // Each offset is one aligned word, so a reader pairs an old and a new one
  // at worst: either leads to a word that is a thread's registered cpu_id or
  // to -1 (the slow path), and a section checks the cpu_id of the very area
  // it arms (rseq_cs.hpp).
  if (inline_ids_need_no_bound()) {
    __atomic_store_n(&g_fast_path.cpu_id, offset + kCpuIdOffset, __ATOMIC_RELAXED);
  }
  if (same_signature) {
    __atomic_store_n(&g_fast_path.area, offset, __ATOMIC_RELAXED);
    aim_sections();
  }
}

// Whether `area` is the other library's area the inline paths read.
bool is_served_other_area(const rseq_area* area) noexcept {
  const std::intptr_t offset = g_state.other_area.load(std::memory_order_acquire);
  return offset != 0 && area == reinterpret_cast<const rseq_area*>(thread_pointer() + offset);
}

// After percpu's registration met another library's: finds that library's
// area through the conventions found at start-up, and shares it for this
// thread if the kernel confirms it is the thread's registration and it shows
// the current CPU. Async-signal-safe: reads and system calls only.
bool adopt_other_area() noexcept {
  const int saved_errno = errno;
  struct candidate {
    bool present;
    std::intptr_t offset;
    unsigned length;
  } candidates[2] = {{false, 0, 0}, {g_state.have_rseq_abi, g_state.rseq_abi_offset, 0}};
  if (g_state.librseq_offset != nullptr && g_state.librseq_size != nullptr &&
      *g_state.librseq_size != 0) {
    candidates[0] = {true, *g_state.librseq_offset, *g_state.librseq_size};
  }
  bool adopted = false;
  for (const candidate& c : candidates) {
    if (!c.present) continue;
    auto* area = reinterpret_cast<rseq_area*>(thread_pointer() + c.offset);
    if (reinterpret_cast<std::uintptr_t>(area) % alignof(rseq_area) != 0) continue;
    if (area == &own_area.area) continue;
    unsigned length = 0;
    bool same_signature = false;
    if (!kernel_confirms(area, c.length, &length, &same_signature)) continue;
    if (!shows_current_cpu(area)) continue;
    shared_area = area;
    shared_length = length;
    shared_sections = same_signature;
    adopted = true;
    if (&c == &candidates[0]) serve_other_area(c.offset, length, same_signature);
    break;
  }
  errno = saved_errno;
  return adopted;
}

// Registers the calling thread's own area. Re-entrant from a signal handler,
// which may interrupt an attempt at any instruction. A handler that finds
// `trying` makes an attempt of its own instead of going without rseq: the
// thread is about to be registered, and a handler told "no rseq" here would
// be the only code on a working kernel that never gets an area (glibc, which
// registers before the thread runs, never shows such a gap). Both orders end
// registered:
//   - the handler runs before the thread's system call: the handler's call
//     registers the area, and the thread's call then fails with EBUSY while
//     the area is live, which counts as success below;
//   - the handler runs after it: the kernel filled cpu_id on the way back to
//     user space, so ensure_registered() answers before calling here.
// A failure is final, and the same for every attempt on this thread; it
// concerns this thread only, except an ENOSYS that says the kernel has no
// rseq at all (kernel_may_lack_rseq()).
bool register_this_thread() noexcept {
  const thread_registration state = registration;
  if (state == thread_registration::registered || state == thread_registration::shared) return true;
  if (state == thread_registration::failed) return false;
  registration = thread_registration::trying;
  // Counted before the call: the kernel fills cpu_id on the way back, and a
  // started section may commit from then on (see g_section_users).
  add_section_users(1);
  std::atomic_signal_fence(std::memory_order_seq_cst);
  const int saved_errno = errno;
  // max(feature size, 32) bytes, as glibc 2.41+ registers: on Linux 7.0+ the
  // kernel then runs the strict V2 mode, which glibc-owned threads get too,
  // so percpu's own threads are held to the same rules (see
  // own_registration_length_for()).
  const long rc = syscall(SYS_rseq, &own_area, g_state.own_length, 0, kRseqSignature);
  const int error = rc == 0 ? 0 : errno;
  errno = saved_errno;
  std::atomic_signal_fence(std::memory_order_seq_cst);

  // EBUSY (same area, length and signature) with our area live means a
  // signal handler that interrupted this attempt registered the area first.
  // EINVAL means another area is registered for this thread: another
  // library's, which percpu shares if it can find and verify it.
  bool ok = error == 0 || (error == EBUSY && own_area.area.cpu_id >= 0);
  const bool shared = !ok && error == EINVAL && adopt_other_area();
  ok = ok || shared;
  if (!ok) add_section_users(-1);
  registration_error = ok ? 0 : error;
  registration = shared ? thread_registration::shared
                 : ok   ? thread_registration::registered
                        : thread_registration::failed;
  if (ok) g_some_thread_registered.store(true, std::memory_order_relaxed);
  if (error == ENOSYS && kernel_may_lack_rseq()) set_owner(rseq_owner::none);
  if (!ok && g_state.forced == forced_backend::rseq && !g_state.forced_rseq_warned.exchange(true)) {
    say({"PERCPU_BACKEND=rseq is unavailable here (rseq registration failed with ",
         errno_name(error), "); using ", to_string(g_state.fallback)});
  }
  return ok;
}

// The area whose ids the kernel keeps current for the calling thread, after
// registering the thread if that is percpu's job and has not been tried yet:
// the serving area (glibc's, percpu's own, or librseq's once the fast path
// reads it: serve_other_area()), another library's area this thread shares,
// or nullptr.
rseq_area* thread_rseq_area() noexcept {
  if (!ensure_initialized()) return nullptr;
  rseq_area* serving = serving_rseq_area();
  if (*reinterpret_cast<volatile const std::int32_t*>(&serving->cpu_id) >= 0) return serving;
  if (g_state.owner.load(std::memory_order_relaxed) != rseq_owner::percpu) return nullptr;
  // percpu registers its own area where the fast path aims at it, or at
  // librseq's on a thread librseq left alone; not under a forced fallback.
  if (serving != &own_area.area && !is_served_other_area(serving)) return nullptr;
  if (!register_this_thread()) return nullptr;
  rseq_area* area = registration == thread_registration::shared ? shared_area : &own_area.area;
  return *reinterpret_cast<volatile const std::int32_t*>(&area->cpu_id) >= 0 ? area : nullptr;
}

bool ensure_registered() noexcept { return thread_rseq_area() != nullptr; }

}  // namespace

int query_fallback(unsigned* cpu, unsigned* node) noexcept {
  return fallback_query(g_state.fallback, cpu, node);
}

namespace {

// Registration is percpu's job at most once per thread, so it stays out of
// line; what remains inline is the fallback itself, which must cost little
// more than the mechanism it wraps.
__attribute__((noinline)) int cpu_id_after_registering() noexcept {
  const rseq_area* area = thread_rseq_area();
  return area != nullptr ? *reinterpret_cast<volatile const std::int32_t*>(&area->cpu_id) : -1;
}

__attribute__((noinline)) int cpu_id_from_syscall() noexcept {
  unsigned cpu = 0;
  return raw_syscall_getcpu(&cpu, nullptr) == 0 ? static_cast<int>(cpu) : 0;
}

}  // namespace

namespace {

// Every id percpu hands out is below max_cpus(), which bounds what the kernel
// can report (see read_max_cpus). Should a kernel ever report more, the id is
// folded into range rather than let a caller index past its array.
int within_max_cpus(int id) noexcept {
  const unsigned limit = static_cast<unsigned>(max_cpus());
  const unsigned value = static_cast<unsigned>(id);
  return static_cast<int>(value < limit ? value : value % limit);
}

int cpu_id_unbounded() noexcept {
  if (!ensure_initialized()) return cpu_id_from_syscall();
  if (g_state.owner.load(std::memory_order_relaxed) == rseq_owner::percpu) {
    const int id = cpu_id_after_registering();
    if (id >= 0) return id;
  }
  switch (g_state.fallback) {
    case cpu_backend::rdpid: return static_cast<int>(rdpid_tsc_aux() & kRdpidCpuMask);
    case cpu_backend::vdso: {
      unsigned cpu = 0;
      if (g_state.vdso_getcpu(&cpu, nullptr, nullptr) == 0) return static_cast<int>(cpu);
      break;
    }
    default: break;
  }
  return cpu_id_from_syscall();
}

}  // namespace

int cpu_id_slow() noexcept {
  // A thread that shares another library's area comes here on every call
  // (the inline path reads percpu's own, unregistered, area): answer it
  // before anything else.
  if (const rseq_area* area = shared_area) {
    const int id = *reinterpret_cast<volatile const std::int32_t*>(&area->cpu_id);
    if (within(id, g_fast_path.cpu_limit)) return id;
  }
  return within_max_cpus(cpu_id_unbounded());
}

int node_id_slow() noexcept {
  // Before start-up thread_rseq_area() is nullptr and the fallback is still
  // the system call.
  const rseq_area* area = thread_rseq_area();
  if (area != nullptr && g_state.feature_size >= kFeatureSizeNodeId) {
    const int node = *reinterpret_cast<volatile const std::int32_t*>(&area->node_id);
    if (node >= 0) return node;
  }
  unsigned node = 0;
  return query_fallback(nullptr, &node) == 0 ? static_cast<int>(node) : 0;
}

int concurrency_id_slow() noexcept {
  if (const rseq_area* area = thread_rseq_area()) {
    const std::int32_t* field =
        g_state.feature_size >= kFeatureSizeMmCid ? &area->mm_cid : &area->cpu_id;
    const int id = *reinterpret_cast<volatile const std::int32_t*>(field);
    if (id >= 0) return within_max_cpus(id);
  }
  return cpu_id_slow();
}

namespace {

// The one decision whether the structures run sections for the calling
// thread: the area they get (nullptr for their no-rseq paths) and why.
// registered_rseq_area() hands them the area and sections_status() reports
// the reason, so the two cannot disagree. The thread's registration is
// attempted first whatever else holds, as cpu_id() would.
rseq_area* decide_sections_for_this_thread(sections* why) noexcept {
  rseq_area* area = thread_rseq_area();
  if (!ensure_initialized()) {
    *why = sections::starting;
  } else if (g_state.sections_decision != sections::on) {
    *why = g_state.sections_decision;
  } else if (area == nullptr) {
    const bool forced_fallback =
        g_state.forced != forced_backend::none && g_state.forced != forced_backend::rseq;
    *why = forced_fallback ? sections::fallback_forced : sections::no_rseq;
  } else if (area == shared_area && !shared_sections) {
    *why = sections::foreign_signature;
  } else {
    *why = sections::on;
  }
  return *why == sections::on ? area : nullptr;
}

}  // namespace

rseq_area* registered_rseq_area() noexcept {
  sections why = sections::on;
  return decide_sections_for_this_thread(&why);
}

rseq_area* area_unless_known_missing() noexcept {
  rseq_area* area = sections_area_if_registered();
  if (area != nullptr) return area;
  if (t_section_state == section_user::no_rseq) return nullptr;
  area = registered_rseq_area();
  if (area == nullptr && t_section_state == section_user::unmarked && ensure_initialized()) {
    t_section_state = section_user::no_rseq;
  }
  return area;
}

bool rseq_sections_enabled() noexcept {
  return ensure_initialized() && g_state.sections_decision == sections::on;
}

sections sections_decision_for(const char* forced, const char* machine,
                               const char* release) noexcept {
  if (forced != nullptr && std::strcmp(forced, "on") == 0) return sections::on;
  if (forced != nullptr && std::strcmp(forced, "off") == 0)
    return sections::disabled_by_environment;
  return rseq_sections_broken_on(machine, release) ? sections::kernel_quirk : sections::on;
}

namespace {

// Leading decimal number of `text`, advancing it; -1 without digits.
int parse_number(const char** text) {
  int value = -1;
  for (; **text >= '0' && **text <= '9'; ++*text) {
    value = (value < 0 ? 0 : value * 10) + (**text - '0');
    if (value > 1000000) return -1;
  }
  return value;
}

}  // namespace

bool rseq_sections_broken_on(const char* machine, const char* release) noexcept {
  if (machine == nullptr || release == nullptr || std::strcmp(machine, "aarch64") != 0)
    return false;
  const char* p = release;
  const int major = parse_number(&p);
  if (major < 0 || *p != '.') return false;
  ++p;
  const int minor = parse_number(&p);
  if (minor < 0) return false;
  int patch = 0;
  if (*p == '.') {
    ++p;
    patch = parse_number(&p);
    if (patch < 0) return false;
  }
  const bool release_candidate = std::strncmp(p, "-rc", 3) == 0;
  // The rewrite of 6.19 dropped the abort; 6.19.y was never known fixed. The
  // fix reached 7.0.y with 7.0.14 (as MongoDB's and Docker's reports tell)
  // and landed in the 7.1 cycle, so 7.1's release candidates count as broken
  // too. Distribution kernels that backport the fix under an older number
  // (Ubuntu's 7.0.0-N) are treated as broken: PERCPU_RSEQ_SECTIONS=on is for
  // them.
  if (major == 6 && minor == 19) return true;
  if (major == 7 && minor == 0) return patch < 14;
  if (major == 7 && minor == 1) return release_candidate;
  return false;
}

unsigned own_registration_length_for(unsigned long feature_size, unsigned long align) noexcept {
  const unsigned long length = feature_size > kRegisteredLength ? feature_size : kRegisteredLength;
  const unsigned long needed_align = align > kRegisteredLength ? align : kRegisteredLength;
  // A length beyond 32 needs alignment to AT_RSEQ_ALIGN; both must fit the
  // static area.
  if (length > sizeof(own_rseq_area) || needed_align > alignof(own_rseq_area)) {
    return kRegisteredLength;
  }
  return static_cast<unsigned>(length);
}

namespace {
// The length `area`, this thread's registered area, was registered with.
unsigned registration_length_of(rseq_area* area) noexcept {
  if (area == &own_area.area) return g_state.own_length;
  if (area == shared_area) return shared_length;
  if (is_served_other_area(area)) return g_state.other_length;
  // glibc's: ask the kernel (see kernel_confirms()).
  const int saved_errno = errno;
  unsigned length = 0;
  bool same_signature = false;
  unsigned glibc_size = 0;
  const unsigned hint = glibc_registered_rseq(nullptr, &glibc_size) ? glibc_size : 0;
  if (!kernel_confirms(area, hint, &length, &same_signature)) {
    length = 0;
  }
  errno = saved_errno;
  return length;
}
}  // namespace

unsigned rseq_registration_length() noexcept {
  rseq_area* area = thread_rseq_area();
  return area != nullptr ? registration_length_of(area) : 0;
}

namespace {
// The registration pause_rseq_for_this_thread() took away, for resume.
__thread rseq_area* paused_area PERCPU_STATIC_TLS = nullptr;
__thread unsigned paused_length PERCPU_STATIC_TLS = 0;
}  // namespace

bool pause_rseq_for_this_thread() noexcept {
  if (paused_area == nullptr) {
    rseq_area* area = thread_rseq_area();
    const unsigned length = area != nullptr ? registration_length_of(area) : 0;
    const int saved_errno = errno;
    // EPERM (another signature): percpu's sections never run on that area.
    if (length != 0 && syscall(SYS_rseq, area, length, kRseqFlagUnregister, kRseqSignature) == 0) {
      paused_area = area;
      paused_length = length;
    }
    errno = saved_errno;
  }
  return sections_area_if_registered() == nullptr;
}

void resume_rseq_for_this_thread() noexcept {
  if (paused_area == nullptr) return;
  const int saved_errno = errno;
  syscall(SYS_rseq, paused_area, paused_length, 0, kRseqSignature);
  errno = saved_errno;
  paused_area = nullptr;
}

int rseq_registration_error() noexcept {
  if (ensure_registered()) return 0;
  if (registration_error != 0) return registration_error;
  return g_state.owner.load() == rseq_owner::glibc ? EPERM : ENOSYS;
}

bool force_backend(cpu_backend backend) noexcept {
  if (backend == cpu_backend::rseq) {
    if (g_state.natural_area == tp_offset_of(&unregistered_area)) return false;
    g_state.forced = forced_backend::none;
    if (g_state.natural_area == tp_offset_of(&own_area)) set_owner(rseq_owner::percpu);
    aim_fast_path(g_state.natural_area, g_state.feature_size);
    if (!ensure_registered()) {
      aim_at_fallback();
      if (g_state.owner.load() == rseq_owner::percpu) set_owner(rseq_owner::none);
      return false;
    }
    return true;
  }
  if (!fallback_usable(backend, nullptr)) return false;
  g_state.forced = as_forced(backend);
  g_state.vdso_getcpu = vdso_getcpu_function();
  set_owner_and_fallback(g_state.owner.load(), backend);
  if (g_state.owner.load() == rseq_owner::percpu) set_owner(rseq_owner::none);
  aim_at_fallback();
  return true;
}

}  // namespace internal

// The public queries of percpu/cpu.hpp that read the registration state: here,
// beside that state, so that the fallback's callers (cpu_hint(), every
// operation of a thread without rseq) reach it in one call.
cpu_backend backend() noexcept {
  return internal::ensure_registered() ? cpu_backend::rseq : internal::g_state.fallback;
}

cpu_backend fallback_backend() noexcept { return internal::g_state.fallback; }

rseq_owner rseq_ownership() noexcept {
  // percpu "owns" rseq only if registration works here; ask on this thread.
  if (internal::g_state.owner == rseq_owner::percpu) {
    const internal::rseq_area* area = internal::thread_rseq_area();
    if (area != nullptr &&
        (area == internal::shared_area || internal::is_served_other_area(area))) {
      return rseq_owner::other;
    }
    if (area == nullptr && internal::registration_error != 0) return rseq_owner::none;
  }
  return internal::g_state.owner;
}

sections sections_status() noexcept {
  sections why = sections::on;
  (void)internal::decide_sections_for_this_thread(&why);
  return why;
}

// As concurrency_id_slow() reads it.
concurrency_source concurrency_id_source() noexcept {
  return backend() == cpu_backend::rseq && rseq_feature_size() >= internal::kFeatureSizeMmCid
             ? concurrency_source::mm_cid
             : concurrency_source::cpu_id;
}

unsigned rseq_feature_size() noexcept {
  if (internal::g_state.owner == rseq_owner::none) return 0;
  if (internal::g_state.owner == rseq_owner::percpu && !internal::ensure_registered()) return 0;
  return internal::g_state.feature_size;
}

}  // namespace percpu
