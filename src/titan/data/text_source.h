// Plain-text document sources. "fortunes": files whose records are separated by lines holding
// only "%" (the Debian fortunes package); "text": one document per non-empty line (as the
// Hugging Face "text" loader). A path is a file or a directory (its regular files, sorted).
#pragma once
#include <string>
#include <vector>

namespace titan::data {

// Default location of the fortunes corpus (Debian package fortunes).
inline constexpr const char* kFortunesDir = "/usr/share/games/fortunes";

// Reads every document. Throws titan::Error for a missing path, invalid UTF-8 (file:line) or a
// source without documents.
std::vector<std::string> load_documents(const std::string& source, const std::string& path);

// Byte offset of the first invalid UTF-8 sequence, or npos when valid.
size_t find_invalid_utf8(const std::string& s);

}  // namespace titan::data
