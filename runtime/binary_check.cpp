// The CPU kernel binary check (rules and limits in binary_check.h): libelf for the tables,
// capstone for the instructions, both well-kept readers of formats too easy to get subtly wrong.
#include "runtime/binary_check.h"

#include <capstone/capstone.h>
#include <gelf.h>
#include <libelf.h>

#include <cstdio>
#include <cstring>
#include <mutex>
#include <set>
#include <vector>

namespace kc {
namespace {

// Math functions an honest kernel may call, each in its double, float and long double spelling.
const char* const kMathBase[] = {
    "exp",   "exp2",  "expm1",  "log",    "log2",      "log10",     "log1p", "sqrt",  "cbrt",     "pow",
    "sin",   "cos",   "tan",    "asin",   "acos",      "atan",      "atan2", "sinh",  "cosh",     "tanh",
    "asinh", "acosh", "atanh",  "erf",    "erfc",      "tgamma",    "lgamma", "fabs", "fmax",     "fmin",
    "fma",   "fmod",  "remainder", "floor", "ceil",    "trunc",     "round", "lround", "llround", "rint",
    "lrint", "llrint", "nearbyint", "hypot", "ldexp",  "frexp",     "modf",  "copysign", "nextafter",
    "scalbn", "ilogb", "logb",  "fdim",   "sincos",    "exp10",
};

// Everything else: memory functions gcc emits for copies and zeroing, the aborts that the stack
// protector and _FORTIFY_SOURCE call (Ubuntu's gcc enables both by default), and libgcc helpers
// that are pure arithmetic (popcount without POPCNT, complex multiply/divide, fp16/bf16 casts).
const char* const kOther[] = {
    "memcpy",        "memmove",       "memset",         "memcmp",         "__stack_chk_fail",
    "__memcpy_chk",  "__memmove_chk", "__memset_chk",   "__popcountdi2",  "__mulsc3",
    "__muldc3",      "__divsc3",      "__divdc3",       "__powisf2",      "__powidf2",
    "__extendhfsf2", "__truncsfhf2",  "__truncdfhf2",   "__extendbfsf2",  "__truncsfbf2",
};

const char* const kLibraries[] = {"libc.so.6", "libm.so.6", "libgcc_s.so.1", "libstdc++.so.6", "libmvec.so.1"};

const std::set<std::string>& allowed_imports() {
  static const std::set<std::string> s = [] {
    std::set<std::string> out(std::begin(kOther), std::end(kOther));
    for (const char* b : kMathBase)
      for (const char* suffix : {"", "f", "l"}) out.insert(std::string(b) + suffix);
    return out;
  }();
  return s;
}

bool import_allowed(const std::string& name, BinaryPolicy p) {
  if (allowed_imports().count(name)) return true;
  return p == BinaryPolicy::kSanitizerBuild && name.rfind("__asan_", 0) == 0;
}

bool library_allowed(const std::string& name, BinaryPolicy p) {
  for (const char* l : kLibraries)
    if (name == l) return true;
  return p == BinaryPolicy::kSanitizerBuild && name.rfind("libasan.so", 0) == 0;
}

BinaryCheck fault(BinaryFault f, std::string detail, std::string section = "") {
  BinaryCheck c;
  c.fault = f;
  c.detail = std::move(detail);
  c.section = std::move(section);
  return c;
}

struct ElfHandle {
  Elf* e = nullptr;
  ~ElfHandle() {
    if (e) elf_end(e);
  }
};

struct CapstoneHandle {
  csh h = 0;
  bool open = false;
  cs_insn* insn = nullptr;
  ~CapstoneHandle() {
    if (insn) cs_free(insn, 1);
    if (open) cs_close(&h);
  }
};

#if defined(__aarch64__)
constexpr int kMachine = EM_AARCH64;
constexpr uint32_t kIrelative = 1032;   // R_AARCH64_IRELATIVE
#else
constexpr int kMachine = EM_X86_64;
constexpr uint32_t kIrelative = 37;     // R_X86_64_IRELATIVE
#endif

bool is_syscall(const cs_insn& i) {
#if defined(__aarch64__)
  return i.id == ARM64_INS_SVC || i.id == ARM64_INS_HVC || i.id == ARM64_INS_SMC;
#else
  // The gates into the kernel. int1 (icebp, 0xf1) and into only raise a trap in the process (into
  // is not even valid in 64-bit mode); flagging them refused honest g++ 13 -march=x86-64-v4 kernels,
  // where a byte the disassembler could not place in an AVX-512 instruction read as 0xf1.
  return i.id == X86_INS_SYSCALL || i.id == X86_INS_SYSENTER || i.id == X86_INS_INT;
#endif
}

// The read-only view of one parsed ELF: section headers with names, for the rules below.
struct Section {
  GElf_Shdr h;
  std::string name;
  Elf_Scn* scn;
};

Result<std::vector<Section>> sections(Elf* e) {
  size_t shstrndx = 0;
  if (elf_getshdrstrndx(e, &shstrndx) != 0) return Status::error(Code::kCorrupt, "no section name table");
  std::vector<Section> out;
  for (Elf_Scn* scn = elf_nextscn(e, nullptr); scn; scn = elf_nextscn(e, scn)) {
    Section s{};
    if (!gelf_getshdr(scn, &s.h)) return Status::error(Code::kCorrupt, "unreadable section header");
    const char* n = elf_strptr(e, shstrndx, s.h.sh_name);
    s.name = n ? n : "";
    s.scn = scn;
    out.push_back(s);
  }
  return out;
}

// Constructors and destructors by section; dynamic tags are checked with the rest of .dynamic.
BinaryCheck check_init_sections(const std::vector<Section>& secs, BinaryPolicy p) {
  for (const auto& s : secs) {
    const bool array = s.h.sh_type == SHT_INIT_ARRAY || s.h.sh_type == SHT_FINI_ARRAY ||
                       s.h.sh_type == SHT_PREINIT_ARRAY;
    const bool named = s.name == ".init" || s.name == ".fini" || s.name == ".ctors" || s.name == ".dtors" ||
                       s.name.rfind(".init_array", 0) == 0 || s.name.rfind(".fini_array", 0) == 0 ||
                       s.name.rfind(".preinit_array", 0) == 0;
    if ((array || named) && s.h.sh_size > 0) {
      if (p == BinaryPolicy::kSanitizerBuild && (s.h.sh_type == SHT_INIT_ARRAY || s.h.sh_type == SHT_FINI_ARRAY))
        continue;   // the instrumentation's module constructor
      return fault(BinaryFault::kConstructor, "non-empty " + s.name + " (" + std::to_string(s.h.sh_size) + " bytes)",
                   s.name);
    }
  }
  return {};
}

// The loader reads the dynamic segment, not section headers: the tables judged here must be the
// ones it will use (a crafted file could point DT_SYMTAB at a table no section names).
bool section_at(const std::vector<Section>& secs, uint64_t addr, uint32_t type) {
  for (const auto& s : secs)
    if (s.h.sh_addr == addr && s.h.sh_type == type) return true;
  return false;
}

BinaryCheck check_dynamic(Elf* e, const Section& s, const std::vector<Section>& secs, BinaryPolicy p) {
  Elf_Data* d = elf_getdata(s.scn, nullptr);
  if (!d || s.h.sh_entsize == 0) return fault(BinaryFault::kMalformed, "unreadable .dynamic", s.name);
  const size_t n = s.h.sh_size / s.h.sh_entsize;
  for (size_t i = 0; i < n; ++i) {
    GElf_Dyn dyn;
    if (!gelf_getdyn(d, static_cast<int>(i), &dyn)) return fault(BinaryFault::kMalformed, "unreadable .dynamic", s.name);
    const int64_t tag = dyn.d_tag;
    if ((tag == DT_SYMTAB && !section_at(secs, dyn.d_un.d_ptr, SHT_DYNSYM)) ||
        (tag == DT_STRTAB && !section_at(secs, dyn.d_un.d_ptr, SHT_STRTAB)) ||
        ((tag == DT_RELA || tag == DT_JMPREL) && !section_at(secs, dyn.d_un.d_ptr, SHT_RELA)) ||
        (tag == DT_REL && !section_at(secs, dyn.d_un.d_ptr, SHT_REL)))
      return fault(BinaryFault::kMalformed, "a dynamic tag points at a table no section header describes", s.name);
    if (tag == DT_INIT || tag == DT_FINI || tag == DT_PREINIT_ARRAY ||
        (p == BinaryPolicy::kKernel && (tag == DT_INIT_ARRAY || tag == DT_FINI_ARRAY))) {
      const char* names[] = {"DT_INIT", "DT_FINI", "DT_PREINIT_ARRAY", "DT_INIT_ARRAY", "DT_FINI_ARRAY"};
      int k = tag == DT_INIT ? 0 : tag == DT_FINI ? 1 : tag == DT_PREINIT_ARRAY ? 2 : tag == DT_INIT_ARRAY ? 3 : 4;
      return fault(BinaryFault::kConstructor, names[k], s.name);
    }
    if (tag == DT_TEXTREL || (tag == DT_FLAGS && (dyn.d_un.d_val & DF_TEXTREL)))
      return fault(BinaryFault::kTextRelocation, "DT_TEXTREL", s.name);
    if (tag == DT_NEEDED) {
      const char* lib = elf_strptr(e, s.h.sh_link, dyn.d_un.d_val);
      if (!lib) return fault(BinaryFault::kMalformed, "DT_NEEDED without a name", s.name);
      if (!library_allowed(lib, p)) return fault(BinaryFault::kLibrary, lib, s.name);
    }
  }
  return {};
}

BinaryCheck check_symbols(Elf* e, const Section& s, BinaryPolicy p) {
  Elf_Data* d = elf_getdata(s.scn, nullptr);
  if (!d || s.h.sh_entsize == 0) return fault(BinaryFault::kMalformed, "unreadable " + s.name, s.name);
  const size_t n = s.h.sh_size / s.h.sh_entsize;
  for (size_t i = 1; i < n; ++i) {   // entry 0 is the null symbol
    GElf_Sym sym;
    if (!gelf_getsym(d, static_cast<int>(i), &sym)) return fault(BinaryFault::kMalformed, "unreadable " + s.name, s.name);
    const char* nm = elf_strptr(e, s.h.sh_link, sym.st_name);
    std::string name = nm ? nm : "";
    if (GELF_ST_TYPE(sym.st_info) == STT_GNU_IFUNC) return fault(BinaryFault::kIfunc, name, s.name);
    if (s.h.sh_type == SHT_DYNSYM && sym.st_shndx == SHN_UNDEF && !name.empty() && !import_allowed(name, p))
      return fault(BinaryFault::kImport, name, s.name);
  }
  return {};
}

BinaryCheck check_relocations(const Section& s) {
  Elf_Data* d = elf_getdata(s.scn, nullptr);
  if (!d || s.h.sh_entsize == 0) return fault(BinaryFault::kMalformed, "unreadable " + s.name, s.name);
  const size_t n = s.h.sh_size / s.h.sh_entsize;
  for (size_t i = 0; i < n; ++i) {
    uint64_t info = 0;
    if (s.h.sh_type == SHT_RELA) {
      GElf_Rela r;
      if (!gelf_getrela(d, static_cast<int>(i), &r)) return fault(BinaryFault::kMalformed, "unreadable " + s.name, s.name);
      info = r.r_info;
    } else {
      GElf_Rel r;
      if (!gelf_getrel(d, static_cast<int>(i), &r)) return fault(BinaryFault::kMalformed, "unreadable " + s.name, s.name);
      info = r.r_info;
    }
    if (GELF_R_TYPE(info) == kIrelative) return fault(BinaryFault::kIfunc, "IRELATIVE relocation", s.name);
  }
  return {};
}

// The function (from .symtab) and section holding virtual address `va`, for the evidence.
void locate(Elf* e, const std::vector<Section>& secs, uint64_t va, BinaryCheck& c) {
  for (const auto& s : secs) {
    if ((s.h.sh_flags & SHF_ALLOC) && va >= s.h.sh_addr && va < s.h.sh_addr + s.h.sh_size) c.section = s.name;
    if (s.h.sh_type != SHT_SYMTAB || s.h.sh_entsize == 0) continue;
    Elf_Data* d = elf_getdata(s.scn, nullptr);
    if (!d) continue;
    for (size_t i = 1; i < s.h.sh_size / s.h.sh_entsize; ++i) {
      GElf_Sym sym;
      if (!gelf_getsym(d, static_cast<int>(i), &sym) || GELF_ST_TYPE(sym.st_info) != STT_FUNC) continue;
      if (va >= sym.st_value && va < sym.st_value + sym.st_size) {
        const char* nm = elf_strptr(e, s.h.sh_link, sym.st_name);
        char off[24];
        std::snprintf(off, sizeof off, "+0x%llx", static_cast<unsigned long long>(va - sym.st_value));
        if (nm) c.function = std::string(nm) + off;
      }
    }
  }
}

// Exactly one .dynamic, the one PT_DYNAMIC names.
Status dynamic_matches(Elf* e, const std::vector<Section>& secs) {
  size_t n = 0, found = 0;
  if (elf_getphdrnum(e, &n) != 0) return Status::error(Code::kCorrupt, "no program headers");
  uint64_t off = UINT64_MAX;
  for (size_t i = 0; i < n; ++i) {
    GElf_Phdr ph;
    if (gelf_getphdr(e, static_cast<int>(i), &ph) && ph.p_type == PT_DYNAMIC) off = ph.p_offset, ++found;
  }
  size_t sections_found = 0;
  for (const auto& s : secs)
    if (s.h.sh_type == SHT_DYNAMIC) {
      ++sections_found;
      if (s.h.sh_offset != off) return Status::error(Code::kCorrupt, "PT_DYNAMIC and .dynamic disagree");
    }
  if (found != 1 || sections_found != 1) return Status::error(Code::kCorrupt, "not exactly one dynamic table");
  return Status::ok();
}

// Segments as the loader maps them (section headers could lie about what is executable).
BinaryCheck check_segments(Elf* e, const std::string& elf, const std::vector<Section>& secs) {
  size_t n = 0;
  if (elf_getphdrnum(e, &n) != 0) return fault(BinaryFault::kMalformed, "no program headers");
  bool stack_seen = false;
  CapstoneHandle cs;
#if defined(__aarch64__)
  cs.open = cs_open(CS_ARCH_ARM64, CS_MODE_ARM, &cs.h) == CS_ERR_OK;
#else
  cs.open = cs_open(CS_ARCH_X86, CS_MODE_64, &cs.h) == CS_ERR_OK;
#endif
  if (!cs.open || !(cs.insn = cs_malloc(cs.h))) return fault(BinaryFault::kUnavailable, "capstone did not start");
  for (size_t i = 0; i < n; ++i) {
    GElf_Phdr ph;
    if (!gelf_getphdr(e, static_cast<int>(i), &ph)) return fault(BinaryFault::kMalformed, "unreadable program header");
    if (ph.p_type == PT_GNU_STACK) {
      stack_seen = true;
      if (ph.p_flags & PF_X) return fault(BinaryFault::kExecutableStack, "PT_GNU_STACK is executable");
    }
    if (ph.p_type != PT_LOAD || !(ph.p_flags & PF_X)) continue;
    if (ph.p_flags & PF_W) return fault(BinaryFault::kWritableCode, "a PT_LOAD segment is writable and executable");
    if (ph.p_offset > elf.size() || ph.p_filesz > elf.size() - ph.p_offset)
      return fault(BinaryFault::kMalformed, "executable segment past the end of the file");
    const uint8_t* code = reinterpret_cast<const uint8_t*>(elf.data()) + ph.p_offset;
    size_t left = ph.p_filesz;
    uint64_t va = ph.p_vaddr;
    while (left > 0) {
      const uint8_t* at = code;
      uint64_t at_va = va;
      if (!cs_disasm_iter(cs.h, &code, &left, &va, cs.insn)) {   // not an instruction: step a byte
        ++code, --left, ++va;
        continue;
      }
      if (is_syscall(*cs.insn)) {
        BinaryCheck c = fault(BinaryFault::kSyscall, std::string(cs.insn->mnemonic) +
                                                         (cs.insn->op_str[0] ? std::string(" ") + cs.insn->op_str : ""));
        c.offset = ph.p_offset + static_cast<uint64_t>(at - (reinterpret_cast<const uint8_t*>(elf.data()) + ph.p_offset));
        locate(e, secs, at_va, c);
        return c;
      }
    }
  }
  if (!stack_seen) return fault(BinaryFault::kExecutableStack, "no PT_GNU_STACK (the loader then makes stacks executable)");
  return {};
}

BinaryCheck check_impl(const std::string& elf, BinaryPolicy p) {
  static std::once_flag once;
  std::call_once(once, [] { elf_version(EV_CURRENT); });
  if (elf.size() < 64 || elf.compare(0, 4, "\x7f" "ELF") != 0) return fault(BinaryFault::kMalformed, "not an ELF file");
  // libelf takes a mutable pointer; a private copy keeps the caller's bytes untouched.
  std::vector<char> image(elf.begin(), elf.end());
  ElfHandle h;
  h.e = elf_memory(image.data(), image.size());
  if (!h.e || elf_kind(h.e) != ELF_K_ELF) return fault(BinaryFault::kMalformed, "libelf cannot read it");
  GElf_Ehdr eh;
  if (!gelf_getehdr(h.e, &eh)) return fault(BinaryFault::kMalformed, "no ELF header");
  if (eh.e_type != ET_DYN || eh.e_machine != kMachine)
    return fault(BinaryFault::kMalformed, "not a shared object for this machine");
  // Every rule below reads section headers: they must all be there.
  if (eh.e_shnum == 0 || eh.e_shoff > elf.size() || uint64_t(eh.e_shnum) * eh.e_shentsize > elf.size() - eh.e_shoff)
    return fault(BinaryFault::kMalformed, "section headers missing or past the end of the file");
  auto secs = sections(h.e);
  if (!secs) return fault(BinaryFault::kMalformed, secs.status().message());
  if (Status ds = dynamic_matches(h.e, secs.value()); !ds) return fault(BinaryFault::kMalformed, ds.message());
  BinaryCheck c = check_init_sections(secs.value(), p);
  for (const auto& s : secs.value()) {
    if (!c.ok()) return c;
    if (s.h.sh_type == SHT_DYNAMIC) c = check_dynamic(h.e, s, secs.value(), p);
    else if (s.h.sh_type == SHT_DYNSYM || s.h.sh_type == SHT_SYMTAB) c = check_symbols(h.e, s, p);
    else if (s.h.sh_type == SHT_RELA || s.h.sh_type == SHT_REL) c = check_relocations(s);
  }
  if (!c.ok()) return c;
  return check_segments(h.e, elf, secs.value());
}

}  // namespace

const char* binary_fault_name(BinaryFault f) {
  switch (f) {
    case BinaryFault::kNone: return "none";
    case BinaryFault::kMalformed: return "malformed";
    case BinaryFault::kImport: return "import";
    case BinaryFault::kLibrary: return "library";
    case BinaryFault::kConstructor: return "constructor";
    case BinaryFault::kIfunc: return "ifunc";
    case BinaryFault::kSyscall: return "syscall";
    case BinaryFault::kWritableCode: return "writable-code";
    case BinaryFault::kExecutableStack: return "executable-stack";
    case BinaryFault::kTextRelocation: return "text-relocation";
    case BinaryFault::kUnavailable: return "unavailable";
  }
  return "?";
}

std::string BinaryCheck::message() const {
  switch (fault) {
    case BinaryFault::kNone: return "binary passed";
    case BinaryFault::kImport: return "imports '" + detail + "' (not allowlisted: kernels may call math and memory functions only)";
    case BinaryFault::kLibrary: return "needs library '" + detail + "' (not allowlisted)";
    case BinaryFault::kConstructor: return "runs code at load or unload: " + detail;
    case BinaryFault::kIfunc: return "IFUNC resolver (runs while loading): " + detail;
    case BinaryFault::kSyscall: {
      char off[24];
      std::snprintf(off, sizeof off, "0x%llx", static_cast<unsigned long long>(offset));
      return "system-call instruction '" + detail + "' at file offset " + off + (section.empty() ? "" : " in " + section) +
             (function.empty() ? "" : " (" + function + ")");
    }
    default: return std::string(binary_fault_name(fault)) + ": " + detail;
  }
}

nlohmann::json BinaryCheck::to_json() const {
  nlohmann::json j = {{"fault", binary_fault_name(fault)}, {"detail", detail}};
  if (!section.empty()) j["section"] = section;
  if (!function.empty()) j["function"] = function;
  if (fault == BinaryFault::kSyscall) j["offset"] = offset;
  return j;
}

Status BinaryCheck::to_status() const {
  return ok() ? Status::ok() : Status::error(Code::kRejected, "CPU kernel binary refused: " + message());
}

BinaryCheck check_cpu_binary(const std::string& elf, BinaryPolicy policy) {
  try {
    return check_impl(elf, policy);
  } catch (const std::exception& e) {   // allocation failure on a huge image
    return fault(BinaryFault::kMalformed, e.what());
  }
}

}  // namespace kc
