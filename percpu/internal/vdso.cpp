#include "percpu/internal/vdso.hpp"

#include <elf.h>
#include <link.h>
#include <sys/auxv.h>

#include <cstdint>
#include <cstring>

namespace percpu {
namespace internal {
namespace {

// The vDSO is a small, kernel-built shared object. Its dynamic symbol table
// and version tables are found through PT_DYNAMIC; its symbol count through
// DT_HASH or, when only DT_GNU_HASH is present, by walking the GNU hash.
struct vdso_image {
  std::uintptr_t load_bias = 0;
  const ElfW(Sym) * symbols = nullptr;
  const char* strings = nullptr;
  const ElfW(Versym) * versym = nullptr;
  const ElfW(Verdef) * verdef = nullptr;
  std::size_t symbol_count = 0;
};

std::size_t count_gnu_hash_symbols(const std::uint32_t* gnu_hash) {
  const std::uint32_t nbuckets = gnu_hash[0];
  const std::uint32_t symoffset = gnu_hash[1];
  const std::uint32_t bloom_size = gnu_hash[2];
  const auto* buckets = reinterpret_cast<const std::uint32_t*>(
      reinterpret_cast<const ElfW(Addr)*>(gnu_hash + 4) + bloom_size);
  const std::uint32_t* chains = buckets + nbuckets;
  std::uint32_t last = 0;
  for (std::uint32_t b = 0; b < nbuckets; ++b) {
    if (buckets[b] > last) last = buckets[b];
  }
  if (last < symoffset) return symoffset;
  while ((chains[last - symoffset] & 1u) == 0) ++last;
  return last + 1;
}

bool load_image(vdso_image* image) {
  const auto base = static_cast<std::uintptr_t>(getauxval(AT_SYSINFO_EHDR));
  if (base == 0) return false;
  const auto* ehdr = reinterpret_cast<const ElfW(Ehdr)*>(base);
  if (std::memcmp(ehdr->e_ident, ELFMAG, SELFMAG) != 0) return false;

  const auto* phdrs = reinterpret_cast<const ElfW(Phdr)*>(base + ehdr->e_phoff);
  const ElfW(Dyn)* dynamic = nullptr;
  bool have_load = false;
  for (int i = 0; i < ehdr->e_phnum; ++i) {
    if (phdrs[i].p_type == PT_LOAD && !have_load) {
      image->load_bias = base + phdrs[i].p_offset - phdrs[i].p_vaddr;
      have_load = true;
    } else if (phdrs[i].p_type == PT_DYNAMIC) {
      dynamic = reinterpret_cast<const ElfW(Dyn)*>(base + phdrs[i].p_offset);
    }
  }
  if (!have_load || dynamic == nullptr) return false;

  const std::uint32_t* sysv_hash = nullptr;
  const std::uint32_t* gnu_hash = nullptr;
  for (const ElfW(Dyn)* d = dynamic; d->d_tag != DT_NULL; ++d) {
    const auto address = image->load_bias + d->d_un.d_ptr;
    switch (d->d_tag) {
      case DT_SYMTAB: image->symbols = reinterpret_cast<const ElfW(Sym)*>(address); break;
      case DT_STRTAB: image->strings = reinterpret_cast<const char*>(address); break;
      case DT_HASH: sysv_hash = reinterpret_cast<const std::uint32_t*>(address); break;
      case DT_GNU_HASH: gnu_hash = reinterpret_cast<const std::uint32_t*>(address); break;
      case DT_VERSYM: image->versym = reinterpret_cast<const ElfW(Versym)*>(address); break;
      case DT_VERDEF: image->verdef = reinterpret_cast<const ElfW(Verdef)*>(address); break;
      default: break;
    }
  }
  if (image->symbols == nullptr || image->strings == nullptr) return false;
  if (sysv_hash != nullptr) {
    image->symbol_count = sysv_hash[1];  // nchain equals the symbol count
  } else if (gnu_hash != nullptr) {
    image->symbol_count = count_gnu_hash_symbols(gnu_hash);
  } else {
    return false;
  }
  if (image->verdef == nullptr) image->versym = nullptr;
  return true;
}

bool version_matches(const vdso_image& image, std::size_t symbol, const char* version) {
  if (version == nullptr || image.versym == nullptr) return true;
  const ElfW(Half) wanted_index = image.versym[symbol] & 0x7fff;
  const ElfW(Verdef)* def = image.verdef;
  for (;;) {
    if ((def->vd_flags & VER_FLG_BASE) == 0 && (def->vd_ndx & 0x7fff) == wanted_index) {
      const auto* aux =
          reinterpret_cast<const ElfW(Verdaux)*>(reinterpret_cast<const char*>(def) + def->vd_aux);
      return std::strcmp(image.strings + aux->vda_name, version) == 0;
    }
    if (def->vd_next == 0) return false;
    def = reinterpret_cast<const ElfW(Verdef)*>(reinterpret_cast<const char*>(def) + def->vd_next);
  }
}

}  // namespace

void* vdso_symbol(const char* name, const char* version) noexcept {
  vdso_image image;
  if (!load_image(&image)) return nullptr;
  for (std::size_t i = 0; i < image.symbol_count; ++i) {
    const ElfW(Sym)& sym = image.symbols[i];
    if (ELF64_ST_TYPE(sym.st_info) != STT_FUNC) continue;
    if (ELF64_ST_BIND(sym.st_info) != STB_GLOBAL && ELF64_ST_BIND(sym.st_info) != STB_WEAK)
      continue;
    if (sym.st_shndx == SHN_UNDEF) continue;
    if (std::strcmp(image.strings + sym.st_name, name) != 0) continue;
    if (!version_matches(image, i, version)) continue;
    return reinterpret_cast<void*>(image.load_bias + sym.st_value);
  }
  return nullptr;
}

}  // namespace internal
}  // namespace percpu
