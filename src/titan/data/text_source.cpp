#include "titan/data/text_source.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "titan/core/error.h"

namespace titan::data {
namespace fs = std::filesystem;

size_t find_invalid_utf8(const std::string& s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    unsigned char c = p[i];
    size_t len;
    uint32_t cp;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      len = 2;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4;
      cp = c & 0x07;
    } else {
      return i;
    }
    if (i + len > n) return i;
    for (size_t k = 1; k < len; ++k) {
      if ((p[i + k] & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (p[i + k] & 0x3F);
    }
    // Overlong forms, surrogates and values past U+10FFFF are invalid.
    if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) ||
        (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF)
      return i;
    i += len;
  }
  return std::string::npos;
}

namespace {

std::vector<fs::path> list_files(const std::string& path) {
  std::error_code ec;
  check(fs::exists(path, ec),
        "dataset path '" + path + "' does not exist; set dataloader.dataset_path");
  std::vector<fs::path> files;
  if (fs::is_directory(path, ec)) {
    for (const auto& e : fs::directory_iterator(path)) {
      if (!e.is_regular_file() || e.is_symlink()) continue;
      std::string ext = e.path().extension().string();
      if (ext == ".dat") continue;  // fortune's binary index files
      files.push_back(e.path());
    }
    std::sort(files.begin(), files.end());
  } else {
    files.push_back(path);
  }
  return files;
}

std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  check(f.good(), "cannot read dataset file '" + p.string() + "'");
  std::ostringstream os;
  os << f.rdbuf();
  return os.str();
}

void check_utf8(const std::string& text, const fs::path& file) {
  size_t bad = find_invalid_utf8(text);
  if (bad == std::string::npos) return;
  size_t line = 1 + std::count(text.begin(), text.begin() + static_cast<long>(bad), '\n');
  throw Error(file.string() + ":" + std::to_string(line) + ": invalid UTF-8 at byte " +
              std::to_string(bad) + "; convert the file to UTF-8 (for example with iconv)");
}

}  // namespace

std::vector<std::string> load_documents(const std::string& source, const std::string& path_in) {
  check(source == "fortunes" || source == "text",
        "dataloader.dataset '" + source + "' is not a built-in source; use fortunes or text");
  std::string path = path_in;
  if (path.empty()) {
    check(source == "fortunes", "dataloader.dataset 'text' needs dataloader.dataset_path");
    path = kFortunesDir;
    std::error_code ec;
    check(fs::exists(path, ec), std::string("the fortunes corpus is missing at ") + kFortunesDir +
                                    "; install the Debian package 'fortunes' or set "
                                    "dataloader.dataset_path");
  }
  std::vector<std::string> docs;
  for (const auto& file : list_files(path)) {
    std::string text = read_file(file);
    check_utf8(text, file);
    std::istringstream in(text);
    std::string line, cur;
    auto flush = [&] {
      if (cur.find_first_not_of(" \t\r\n") != std::string::npos) docs.push_back(cur);
      cur.clear();
    };
    while (std::getline(in, line)) {
      if (source == "fortunes") {
        if (line == "%") {
          flush();
        } else {
          cur += line;
          cur += '\n';
        }
      } else {
        cur = line;
        flush();
      }
    }
    flush();
  }
  check(!docs.empty(), "dataset '" + source + "' at '" + path +
                           "' has no documents; point dataloader.dataset_path at non-empty text");
  return docs;
}

}  // namespace titan::data
