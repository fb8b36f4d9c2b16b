// Functions of a loaded library that it does not export, found by name in its ELF symbol table
// (.symtab, which MLX's wheels keep: they are not stripped). jit.cpp needs one: MLX's CUDA
// backend allocates its primitives' outputs in device memory through cu::malloc_async(size,
// encoder), a function local to libmlx; the exported allocator's malloc gives managed memory
// (MLX 0.32.4: malloc_async(size, -1, nullptr)). An address found this way is used only where the
// same lookup gives an exported anchor function's own address back, so a library laid out
// otherwise than the lookup assumes is never called into.
#include "internal.h"

#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace {

// The file at `path` mapped read-only for the scope's life (empty where it cannot be).
class Mapped {
 public:
  explicit Mapped(const std::string& path) {
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      return;
    }
    struct stat st {};
    if (fstat(fd, &st) == 0 && st.st_size > 0) {
      void* p = mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
      if (p != MAP_FAILED) {
        base_ = static_cast<const char*>(p);
        size_ = static_cast<size_t>(st.st_size);
      }
    }
    close(fd);
  }
  ~Mapped() {
    if (base_ != nullptr) {
      munmap(const_cast<char*>(base_), size_);
    }
  }
  Mapped(const Mapped&) = delete;
  Mapped& operator=(const Mapped&) = delete;
  // The `n` bytes at `offset`, or null where they are not all in the file.
  const char* at(uint64_t offset, uint64_t n) const {
    return base_ != nullptr && offset <= size_ && n <= size_ - offset ? base_ + offset : nullptr;
  }

 private:
  const char* base_ = nullptr;
  size_t size_ = 0;
};

}  // namespace

std::vector<uint64_t> shim::elf_function_values(const std::string& path, const std::vector<std::string>& names) {
  std::vector<uint64_t> values(names.size(), 0);
  const Mapped file(path);
  const auto* eh = reinterpret_cast<const Elf64_Ehdr*>(file.at(0, sizeof(Elf64_Ehdr)));
  if (eh == nullptr || std::memcmp(eh->e_ident, ELFMAG, SELFMAG) != 0 || eh->e_ident[EI_CLASS] != ELFCLASS64 ||
      eh->e_shentsize != sizeof(Elf64_Shdr)) {
    return values;
  }
  const auto* sections =
      reinterpret_cast<const Elf64_Shdr*>(file.at(eh->e_shoff, uint64_t{eh->e_shnum} * sizeof(Elf64_Shdr)));
  if (sections == nullptr) {
    return values;
  }
  for (int i = 0; i < eh->e_shnum; ++i) {
    const Elf64_Shdr& symtab = sections[i];
    if (symtab.sh_type != SHT_SYMTAB || symtab.sh_link >= eh->e_shnum) {
      continue;
    }
    const Elf64_Shdr& strtab = sections[symtab.sh_link];
    const auto* syms = reinterpret_cast<const Elf64_Sym*>(file.at(symtab.sh_offset, symtab.sh_size));
    const char* strs = file.at(strtab.sh_offset, strtab.sh_size);
    if (syms == nullptr || strs == nullptr || strtab.sh_size == 0 || strs[strtab.sh_size - 1] != '\0') {
      continue;
    }
    for (uint64_t k = 0; k < symtab.sh_size / sizeof(Elf64_Sym); ++k) {
      const Elf64_Sym& s = syms[k];
      if (ELF64_ST_TYPE(s.st_info) != STT_FUNC || s.st_value == 0 || s.st_name >= strtab.sh_size) {
        continue;
      }
      const char* name = strs + s.st_name;
      for (size_t j = 0; j < names.size(); ++j) {
        if (values[j] == 0 && names[j] == name) {
          values[j] = s.st_value;
        }
      }
    }
  }
  return values;
}

void* shim::local_function(void* anchor, const char* anchor_name, const char* name) {
  Dl_info info{};
  if (anchor == nullptr || dladdr(anchor, &info) == 0 || info.dli_fname == nullptr || info.dli_fbase == nullptr) {
    return nullptr;
  }
  const auto values = elf_function_values(info.dli_fname, {anchor_name, name});
  const auto base = reinterpret_cast<uintptr_t>(info.dli_fbase);
  if (values[0] == 0 || values[1] == 0 || base + values[0] != reinterpret_cast<uintptr_t>(anchor)) {
    return nullptr;
  }
  return reinterpret_cast<void*>(base + values[1]);
}

int mlxs_elf_function_value(const char* path, const char* name, uint64_t* value) {
  return shim::guard([&] { *value = shim::elf_function_values(path, {name})[0]; });
}
