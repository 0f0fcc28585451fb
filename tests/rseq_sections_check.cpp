// rseq_sections_check: verifies the rseq critical-section tables of built
// ELF binaries (x86-64 and aarch64, 64-bit little-endian).
//
//   rseq_sections_check FILE...            check each file; exit 1 on any problem
//   rseq_sections_check --self-test FILE   check FILE, then check copies of it
//                                          with one planted defect each, and
//                                          fail unless every defect is caught
//
// What is checked, for every descriptor in __rseq_cs:
//   - it is 32-byte aligned, version 0, flags 0, with a non-empty range;
//   - start_ip and abort_ip lie in executable sections;
//   - abort_ip is outside [start_ip, start_ip + post_commit_offset);
//   - the 4 bytes before abort_ip are the architecture's rseq signature;
//   - __rseq_cs_ptr_array points at it, and every pointer there points at a
//     descriptor;
//   - every (start_ip, exit_ip) pair in __rseq_exit_point_array names a
//     descriptor's start and exits outside its range.
// A file without any descriptor fails: the check must never pass vacuously.
//
// Position-independent binaries keep pointers as RELATIVE relocations; the
// reader takes a word's value from the relocation's addend when one targets
// it (some linkers leave the section bytes zero), else from the bytes.

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace {

constexpr std::uint16_t kMachineX86_64 = 62;
constexpr std::uint16_t kMachineAarch64 = 183;
constexpr std::uint32_t kSigX86_64 = 0x53053053;
constexpr std::uint32_t kSigAarch64 = 0xd428bc00;
constexpr std::uint32_t kRelocRelativeX86_64 = 8;
constexpr std::uint32_t kRelocRelativeAarch64 = 1027;
constexpr std::uint32_t kShtRela = 4;
constexpr std::uint32_t kShtNobits = 8;
constexpr std::uint64_t kShfExecinstr = 4;

struct section {
  std::string name;
  std::uint32_t type = 0;
  std::uint64_t flags = 0;
  std::uint64_t addr = 0;
  std::uint64_t offset = 0;
  std::uint64_t size = 0;
  std::uint64_t entsize = 0;
};

template <typename T>
bool read_at(const std::vector<unsigned char>& image, std::uint64_t offset, T* out) {
  if (offset > image.size() || image.size() - offset < sizeof(T)) return false;
  std::memcpy(out, image.data() + offset, sizeof(T));
  return true;
}

template <typename T>
void write_at(std::vector<unsigned char>* image, std::uint64_t offset, T value) {
  std::memcpy(image->data() + offset, &value, sizeof(T));
}

class elf_file {
 public:
  // Parses the section table; on failure returns false and sets *error.
  bool parse(const std::vector<unsigned char>& image, std::string* error) {
    image_ = &image;
    if (image.size() < 64 || std::memcmp(image.data(),
                                         "\x7f"
                                         "ELF",
                                         4) != 0) {
      *error = "not an ELF file";
      return false;
    }
    if (image[4] != 2 || image[5] != 1) {
      *error = "not a 64-bit little-endian ELF file";
      return false;
    }
    std::uint64_t shoff = 0;
    std::uint16_t shentsize = 0, shnum = 0, shstrndx = 0;
    read_at(image, 18, &machine_);
    read_at(image, 40, &shoff);
    read_at(image, 58, &shentsize);
    read_at(image, 60, &shnum);
    read_at(image, 62, &shstrndx);
    if (machine_ != kMachineX86_64 && machine_ != kMachineAarch64) {
      *error = "unsupported e_machine " + std::to_string(machine_);
      return false;
    }
    if (shentsize != 64 || shnum == 0 || shstrndx >= shnum ||
        shoff + std::uint64_t{shnum} * 64 > image.size()) {
      *error = "bad section header table";
      return false;
    }
    std::vector<std::uint32_t> name_offsets;
    for (std::uint16_t i = 0; i < shnum; ++i) {
      const std::uint64_t h = shoff + std::uint64_t{i} * 64;
      section s;
      std::uint32_t name = 0;
      read_at(image, h, &name);
      read_at(image, h + 4, &s.type);
      read_at(image, h + 8, &s.flags);
      read_at(image, h + 16, &s.addr);
      read_at(image, h + 24, &s.offset);
      read_at(image, h + 32, &s.size);
      read_at(image, h + 56, &s.entsize);
      if (s.type != kShtNobits && s.offset + s.size > image.size()) {
        *error = "section extends past the end of the file";
        return false;
      }
      name_offsets.push_back(name);
      sections_.push_back(s);
    }
    const section& strtab = sections_[shstrndx];
    for (std::size_t i = 0; i < sections_.size(); ++i) {
      std::uint64_t at = strtab.offset + name_offsets[i];
      while (at < strtab.offset + strtab.size && image[at] != 0) {
        sections_[i].name.push_back(static_cast<char>(image[at++]));
      }
    }
    const std::uint32_t relative =
        machine_ == kMachineX86_64 ? kRelocRelativeX86_64 : kRelocRelativeAarch64;
    for (const section& s : sections_) {
      if (s.type != kShtRela || s.entsize != 24) continue;
      for (std::uint64_t at = s.offset; at + 24 <= s.offset + s.size; at += 24) {
        std::uint64_t where = 0, info = 0;
        read_at(image, at, &where);
        read_at(image, at + 8, &info);
        if ((info & 0xffffffffu) == relative) relative_addend_at_[where] = at + 16;
      }
    }
    return true;
  }

  std::uint16_t machine() const { return machine_; }
  std::uint32_t signature() const { return machine_ == kMachineX86_64 ? kSigX86_64 : kSigAarch64; }

  const section* find(const char* name) const {
    for (const section& s : sections_) {
      if (s.name == name) return &s;
    }
    return nullptr;
  }

  // The section whose bytes hold virtual address `vaddr`, or nullptr.
  const section* containing(std::uint64_t vaddr, std::uint64_t length) const {
    for (const section& s : sections_) {
      if (s.addr == 0 || s.type == kShtNobits) continue;
      if (vaddr >= s.addr && vaddr - s.addr + length <= s.size) return &s;
    }
    return nullptr;
  }

  // File offset of `vaddr` (which must be in some section), or ~0.
  std::uint64_t file_offset(std::uint64_t vaddr, std::uint64_t length) const {
    const section* s = containing(vaddr, length);
    return s == nullptr ? ~std::uint64_t{0} : s->offset + (vaddr - s->addr);
  }

  // The pointer-sized value stored at `vaddr` once relocated (load base 0).
  bool word(std::uint64_t vaddr, std::uint64_t* value) const {
    const auto reloc = relative_addend_at_.find(vaddr);
    if (reloc != relative_addend_at_.end()) return read_at(*image_, reloc->second, value);
    const std::uint64_t at = file_offset(vaddr, 8);
    return at != ~std::uint64_t{0} && read_at(*image_, at, value);
  }

  // Where `word(vaddr)` reads from, for planting defects: the relocation
  // addend and/or the section bytes.
  void locations(std::uint64_t vaddr, std::vector<std::uint64_t>* offsets) const {
    const auto reloc = relative_addend_at_.find(vaddr);
    if (reloc != relative_addend_at_.end()) offsets->push_back(reloc->second);
    const std::uint64_t at = file_offset(vaddr, 8);
    if (at != ~std::uint64_t{0}) offsets->push_back(at);
  }

  bool executable(std::uint64_t vaddr) const {
    const section* s = containing(vaddr, 1);
    return s != nullptr && (s->flags & kShfExecinstr) != 0;
  }

 private:
  const std::vector<unsigned char>* image_ = nullptr;
  std::uint16_t machine_ = 0;
  std::vector<section> sections_;
  std::map<std::uint64_t, std::uint64_t> relative_addend_at_;  // vaddr -> file offset of addend
};

struct descriptor {
  std::uint64_t addr;
  std::uint32_t version, flags;
  std::uint64_t start_ip, post_commit_offset, abort_ip;
};

struct report {
  int descriptors = 0;
  int pointers = 0;
  int exit_points = 0;
  std::vector<std::string> problems;
  void fail(const std::string& what) { problems.push_back(what); }
};

std::string hex(std::uint64_t v) {
  char text[32];
  std::snprintf(text, sizeof(text), "0x%llx", static_cast<unsigned long long>(v));
  return text;
}

report check_image(const std::vector<unsigned char>& image) {
  report r;
  elf_file elf;
  std::string error;
  if (!elf.parse(image, &error)) {
    r.fail(error);
    return r;
  }
  const section* cs = elf.find("__rseq_cs");
  if (cs == nullptr || cs->size == 0) {
    r.fail("no __rseq_cs section: no critical sections to check");
    return r;
  }
  if (cs->addr % 32 != 0) r.fail("__rseq_cs starts at " + hex(cs->addr) + ", not 32-byte aligned");
  if (cs->size % 32 != 0) r.fail("__rseq_cs size is not a multiple of 32");

  std::map<std::uint64_t, descriptor> by_addr;
  for (std::uint64_t off = 0; off + 32 <= cs->size; off += 32) {
    descriptor d{};
    d.addr = cs->addr + off;
    read_at(image, cs->offset + off, &d.version);
    read_at(image, cs->offset + off + 4, &d.flags);
    if (!elf.word(d.addr + 8, &d.start_ip) || !elf.word(d.addr + 16, &d.post_commit_offset) ||
        !elf.word(d.addr + 24, &d.abort_ip)) {
      r.fail("descriptor " + hex(d.addr) + ": unreadable");
      continue;
    }
    ++r.descriptors;
    by_addr[d.addr] = d;
    const std::string at = "descriptor " + hex(d.addr) + ": ";
    if (d.addr % 32 != 0) r.fail(at + "not 32-byte aligned");
    if (d.version != 0) r.fail(at + "version " + std::to_string(d.version) + ", not 0");
    if (d.flags != 0) r.fail(at + "flags " + std::to_string(d.flags) + ", not 0");
    if (d.post_commit_offset == 0) r.fail(at + "empty range");
    if (!elf.executable(d.start_ip)) r.fail(at + "start_ip " + hex(d.start_ip) + " not in code");
    if (!elf.executable(d.abort_ip)) r.fail(at + "abort_ip " + hex(d.abort_ip) + " not in code");
    if (d.abort_ip >= d.start_ip && d.abort_ip - d.start_ip < d.post_commit_offset) {
      r.fail(at + "abort_ip " + hex(d.abort_ip) + " inside [start_ip, post-commit)");
    }
    const std::uint64_t sig_at = elf.file_offset(d.abort_ip - 4, 4);
    std::uint32_t sig = 0;
    if (sig_at == ~std::uint64_t{0} || !read_at(image, sig_at, &sig)) {
      r.fail(at + "no bytes before abort_ip");
    } else if (sig != elf.signature()) {
      r.fail(at + "the 4 bytes before abort_ip are " + hex(sig) + ", not the signature " +
             hex(elf.signature()));
    }
  }

  std::set<std::uint64_t> pointed;
  const section* ptrs = elf.find("__rseq_cs_ptr_array");
  if (ptrs == nullptr || ptrs->size == 0) {
    r.fail("no __rseq_cs_ptr_array section");
  } else {
    for (std::uint64_t off = 0; off + 8 <= ptrs->size; off += 8) {
      std::uint64_t target = 0;
      ++r.pointers;
      if (!elf.word(ptrs->addr + off, &target) || by_addr.count(target) == 0) {
        r.fail("__rseq_cs_ptr_array[" + std::to_string(off / 8) + "] = " + hex(target) +
               " is not a descriptor");
        continue;
      }
      pointed.insert(target);
    }
  }
  for (const auto& entry : by_addr) {
    if (pointed.count(entry.first) == 0) {
      r.fail("descriptor " + hex(entry.first) + ": missing from __rseq_cs_ptr_array");
    }
  }

  std::multimap<std::uint64_t, const descriptor*> by_start;
  for (const auto& entry : by_addr) by_start.emplace(entry.second.start_ip, &entry.second);
  if (const section* exits = elf.find("__rseq_exit_point_array")) {
    for (std::uint64_t off = 0; off + 16 <= exits->size; off += 16) {
      std::uint64_t start = 0, exit_ip = 0;
      ++r.exit_points;
      const std::string at = "__rseq_exit_point_array[" + std::to_string(off / 16) + "]: ";
      if (!elf.word(exits->addr + off, &start) || !elf.word(exits->addr + off + 8, &exit_ip)) {
        r.fail(at + "unreadable");
        continue;
      }
      const auto range = by_start.equal_range(start);
      if (range.first == range.second) {
        r.fail(at + "start_ip " + hex(start) + " is no descriptor's start");
        continue;
      }
      for (auto it = range.first; it != range.second; ++it) {
        const descriptor& d = *it->second;
        if (exit_ip >= d.start_ip && exit_ip - d.start_ip < d.post_commit_offset) {
          r.fail(at + "exit_ip " + hex(exit_ip) + " inside its section");
        }
      }
      if (!elf.executable(exit_ip)) r.fail(at + "exit_ip " + hex(exit_ip) + " not in code");
    }
  }
  return r;
}

bool load(const char* path, std::vector<unsigned char>* image) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  image->assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  return true;
}

int check_files(int argc, char** argv) {
  int failed = 0;
  for (int i = 1; i < argc; ++i) {
    std::vector<unsigned char> image;
    if (!load(argv[i], &image)) {
      std::fprintf(stderr, "%s: cannot read\n", argv[i]);
      ++failed;
      continue;
    }
    const report r = check_image(image);
    for (const std::string& p : r.problems) std::fprintf(stderr, "%s: %s\n", argv[i], p.c_str());
    std::printf("%s: %d descriptors, %d pointers, %d exit points: %s\n", argv[i], r.descriptors,
                r.pointers, r.exit_points, r.problems.empty() ? "OK" : "FAILED");
    if (!r.problems.empty()) ++failed;
  }
  return failed == 0 ? 0 : 1;
}

// Writes `value` everywhere the checker reads the word at `vaddr` from.
void plant_word(const elf_file& elf, std::vector<unsigned char>* image, std::uint64_t vaddr,
                std::uint64_t value) {
  std::vector<std::uint64_t> offsets;
  elf.locations(vaddr, &offsets);
  for (std::uint64_t at : offsets) write_at(image, at, value);
}

int self_test(const char* path) {
  std::vector<unsigned char> pristine;
  if (!load(path, &pristine)) {
    std::fprintf(stderr, "%s: cannot read\n", path);
    return 1;
  }
  const report base = check_image(pristine);
  if (!base.problems.empty() || base.descriptors == 0) {
    std::fprintf(stderr, "self-test: %s must pass before defects are planted\n", path);
    for (const std::string& p : base.problems) std::fprintf(stderr, "  %s\n", p.c_str());
    return 1;
  }
  elf_file elf;
  std::string error;
  elf.parse(pristine, &error);
  const section* cs = elf.find("__rseq_cs");
  const section* ptrs = elf.find("__rseq_cs_ptr_array");
  const section* exits = elf.find("__rseq_exit_point_array");
  std::uint64_t first = 0, start = 0, pco = 0, abort_ip = 0;
  elf.word(ptrs->addr, &first);
  elf.word(first + 8, &start);
  elf.word(first + 16, &pco);
  elf.word(first + 24, &abort_ip);

  struct defect {
    const char* name;
    void (*plant)(const elf_file&, std::vector<unsigned char>*, std::uint64_t first,
                  std::uint64_t start, std::uint64_t pco, std::uint64_t abort_ip, const section* cs,
                  const section* ptrs, const section* exits);
  };
  const defect defects[] = {
      {"flipped signature byte",
       [](const elf_file& e, std::vector<unsigned char>* im, std::uint64_t, std::uint64_t,
          std::uint64_t, std::uint64_t abort, const section*, const section*,
          const section*) { (*im)[e.file_offset(abort - 4, 4)] ^= 0x01; }},
      {"abort_ip inside the section",
       [](const elf_file& e, std::vector<unsigned char>* im, std::uint64_t d, std::uint64_t s,
          std::uint64_t, std::uint64_t, const section*, const section*,
          const section*) { plant_word(e, im, d + 24, s); }},
      {"version 1", [](const elf_file& e, std::vector<unsigned char>* im, std::uint64_t d,
                       std::uint64_t, std::uint64_t, std::uint64_t, const section*, const section*,
                       const section*) { write_at<std::uint32_t>(im, e.file_offset(d, 4), 1); }},
      {"pointer to a misaligned descriptor",
       [](const elf_file& e, std::vector<unsigned char>* im, std::uint64_t d, std::uint64_t,
          std::uint64_t, std::uint64_t, const section*, const section* p,
          const section*) { plant_word(e, im, p->addr, d + 8); }},
      {"misaligned __rseq_cs",
       [](const elf_file&, std::vector<unsigned char>* im, std::uint64_t, std::uint64_t,
          std::uint64_t, std::uint64_t, const section* c, const section*, const section*) {
         // Patch sh_addr in the section header that describes __rseq_cs.
         std::uint64_t shoff = 0;
         std::uint16_t shnum = 0;
         read_at(*im, 40, &shoff);
         read_at(*im, 60, &shnum);
         for (std::uint16_t i = 0; i < shnum; ++i) {
           std::uint64_t addr = 0, offset = 0;
           read_at(*im, shoff + i * 64u + 16, &addr);
           read_at(*im, shoff + i * 64u + 24, &offset);
           if (addr == c->addr && offset == c->offset) {
             write_at<std::uint64_t>(im, shoff + i * 64u + 16, addr + 8);
           }
         }
       }},
      {"exit point inside its section",
       [](const elf_file& e, std::vector<unsigned char>* im, std::uint64_t, std::uint64_t,
          std::uint64_t, std::uint64_t, const section*, const section*, const section* x) {
         std::uint64_t s = 0;
         e.word(x->addr, &s);
         plant_word(e, im, x->addr + 8, s);
       }},
  };
  int missed = 0;
  for (const defect& d : defects) {
    if (std::strcmp(d.name, "exit point inside its section") == 0 && exits == nullptr) {
      std::fprintf(stderr, "self-test: %s has no __rseq_exit_point_array\n", path);
      ++missed;
      continue;
    }
    std::vector<unsigned char> broken = pristine;
    d.plant(elf, &broken, first, start, pco, abort_ip, cs, ptrs, exits);
    const report r = check_image(broken);
    std::printf("self-test: %-36s %s", d.name, r.problems.empty() ? "MISSED\n" : "caught: ");
    if (!r.problems.empty()) std::printf("%s\n", r.problems.front().c_str());
    if (r.problems.empty()) ++missed;
  }
  std::printf("self-test: %d descriptors in the pristine file; %s\n", base.descriptors,
              missed == 0 ? "every planted defect was caught" : "some defects were missed");
  return missed == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::strcmp(argv[1], "--self-test") == 0) return self_test(argv[2]);
  if (argc < 2 || argv[1][0] == '-') {
    std::fprintf(stderr,
                 "usage: rseq_sections_check FILE...\n"
                 "       rseq_sections_check --self-test FILE\n");
    return 2;
  }
  return check_files(argc, argv);
}
