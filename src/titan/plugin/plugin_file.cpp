// The checks a plugin file passes before dlopen maps it (plugin/registry.h). Kept apart from the
// registry so that its fuzz target links without the ops.
#include <elf.h>

#include <cstdint>
#include <cstring>
#include <fstream>

#include "titan/core/error.h"
#include "titan/core/file_io.h"
#include "titan/plugin/registry.h"

namespace titan::plugin {

void check_plugin_file(const std::string& path, const std::string& lib) {
  io::check_input_file(path, "plugin '" + lib + "':");
  std::ifstream f(path, std::ios::binary);
  if (!f) return;  // dlopen names what is wrong
  const auto bad = [&](const std::string& why) {
    return Error("cannot load plugin '" + lib + "': " + path + " is not a valid shared library (" +
                 why + "); rebuild it or give the right file");
  };
  f.seekg(0, std::ios::end);
  const auto size = static_cast<uint64_t>(f.tellg());
  f.seekg(0);
  Elf64_Ehdr eh{};
  if (!f.read(reinterpret_cast<char*>(&eh), sizeof eh)) throw bad("shorter than an ELF header");
  if (std::memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0) throw bad("no ELF magic number");
#if defined(__x86_64__)
  constexpr int kMachine = EM_X86_64;
#elif defined(__aarch64__)
  constexpr int kMachine = EM_AARCH64;
#else
  const int kMachine = eh.e_machine;  // no check on other architectures
#endif
  if (eh.e_ident[EI_CLASS] != ELFCLASS64 || eh.e_machine != kMachine)
    throw bad("not a 64-bit object for this machine's architecture");
  if (eh.e_type != ET_DYN) throw bad("not a shared object");
  // [off, off + len) within the file, without overflow.
  const auto within = [&](uint64_t off, uint64_t len) { return off <= size && len <= size - off; };
  if (eh.e_phentsize != sizeof(Elf64_Phdr) ||
      !within(eh.e_phoff, uint64_t{eh.e_phnum} * sizeof(Elf64_Phdr)))
    throw bad("its program headers lie past the end of the file: truncated?");
  if (!within(eh.e_shoff, uint64_t{eh.e_shnum} * eh.e_shentsize))
    throw bad("its section headers lie past the end of the file: truncated?");
  for (int i = 0; i < eh.e_phnum; ++i) {
    Elf64_Phdr ph{};
    f.seekg(static_cast<std::streamoff>(eh.e_phoff + uint64_t(i) * sizeof ph));
    if (!f.read(reinterpret_cast<char*>(&ph), sizeof ph)) throw bad("unreadable program header");
    if (ph.p_type == PT_LOAD && !within(ph.p_offset, ph.p_filesz))
      throw bad("a loadable segment (bytes " + std::to_string(ph.p_filesz) + " at " +
                std::to_string(ph.p_offset) + ") lies past the end of the file (" +
                std::to_string(size) + " bytes): truncated?");
  }
}

}  // namespace titan::plugin
