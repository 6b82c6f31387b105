#include "titan/data/text_source.h"

#include <glob.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "nlohmann/json.hpp"
#include "titan/core/error.h"
#include "titan/core/file_io.h"
#include "titan/data/gzip_file.h"
#include "titan/data/hf_tokenizer.h"
#include "titan/data/text_corpus.h"

namespace titan::data {
namespace fs = std::filesystem;

size_t find_invalid_utf8(std::string_view s) {
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

bool is_blank(std::string_view s) { return s.find_first_not_of(" \t\r\n") == std::string::npos; }

bool json_document(const nlohmann::json& j, const std::string& at, const std::string& what,
                   const SourceOptions& o, bool strings_ok, SourceStats* st, std::string* text) {
  if (strings_ok && j.is_string()) {
    *text = j.get<std::string>();
  } else if (!j.is_object()) {
    check(o.skip_malformed, at + ": the " + what + " is not a JSON object" +
                                (strings_ok ? " or string" : "") + skip_malformed_hint(o, what));
    if (st->malformed++ == 0) st->first_malformed = at;
    return false;
  } else {
    auto it = j.find(o.text_field);
    if (it == j.end() || !it->is_string()) {
      check(o.skip_malformed, at + ": " + (it == j.end() ? "no field '" : "field '") +
                                  o.text_field + (it == j.end() ? "'" : "' is not a string") +
                                  "; " + o.text_field_hint + " to the field holding the text" +
                                  skip_malformed_hint(o, what));
      if (st->missing_field++ == 0) st->first_missing = at;
      return false;
    }
    *text = it->get<std::string>();
  }
  if (is_blank(*text)) {
    ++st->empty;
    return false;
  }
  return true;
}

namespace {

// "x.bin.tmp1234": a shard titan tokenize is still writing.
bool being_written(const std::string& name) {
  const size_t t = name.rfind(".tmp");
  return t != std::string::npos && t + 4 < name.size() &&
         name.find_first_not_of("0123456789", t + 4) == std::string::npos;
}

void add_path(const std::string& path, const std::string& section, std::vector<std::string>* out) {
  std::error_code ec;
  check(fs::exists(path, ec),
        "dataset path '" + path + "' does not exist; set " + section + ".dataset_path");
  if (!fs::is_directory(path, ec)) {
    out->push_back(path);
    return;
  }
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(path)) {
    if (!e.is_regular_file() || e.is_symlink()) continue;
    const std::string name = e.path().filename().string();
    if (name.empty() || name[0] == '.') continue;  // hidden files
    if (e.path().extension() == ".dat") continue;  // fortune's binary index files
    if (being_written(name)) continue;
    files.push_back(e.path().string());
  }
  std::sort(files.begin(), files.end());
  out->insert(out->end(), files.begin(), files.end());
}

std::string read_file(const std::string& p) {
  if (is_gzip_name(p)) return read_gzip(p);
  io::check_input_file(p, "dataset file");
  std::ifstream f(p, std::ios::binary);
  check(f.good(), "cannot read dataset file '" + p + "'");
  std::ostringstream os;
  os << f.rdbuf();
  return os.str();
}

std::string where(const std::string& file, int64_t line) {
  return file + ":" + std::to_string(line);
}

std::string skip_hint(const SourceOptions& o, const std::string& what) {
  return " (or " + o.skip_malformed_hint + " to skip and count such " + what + "s)";
}

}  // namespace

void parse_json_line(const std::string& line, const std::string& file, int64_t lineno,
                     const SourceOptions& o, SourceStats* st, const JsonRecordFn& fn) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(line);
  } catch (const nlohmann::json::exception& e) {  // parse_error, or out_of_range (1e999)
    const auto* pe = dynamic_cast<const nlohmann::json::parse_error*>(&e);
    check(o.skip_malformed, where(file, lineno) + ": the line is malformed JSON (" +
                                (pe ? "error at byte " + std::to_string(pe->byte) : e.what()) +
                                ")" + skip_hint(o, "line"));
    if (st->malformed++ == 0) st->first_malformed = where(file, lineno);
    return;
  }
  fn(j, where(file, lineno), "line");
}

// A .json file holding one JSON array (Hugging Face's json loader reads these as well as JSON
// lines): every element is a record.
void parse_json_array(const std::string& text, const std::string& file, const JsonRecordFn& fn) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {  // parse_error, or out_of_range (1e999)
    const auto* pe = dynamic_cast<const nlohmann::json::parse_error*>(&e);
    throw Error(file + ": not valid JSON (" +
                (pe ? "error at byte " + std::to_string(pe->byte) : std::string(e.what())) +
                "); a .json dataset file holds one JSON array of records, or JSON lines");
  }
  for (size_t i = 0; i < j.size(); ++i)
    fn(j[i], file + ": element " + std::to_string(i), "element");
}

bool is_json_array_file(const std::string& file, std::string_view text) {
  std::string ext =
      fs::path(is_gzip_name(file) ? file.substr(0, file.size() - 3) : file).extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  const size_t first = text.find_first_not_of(" \t\r\n");
  return ext == ".json" && first != std::string::npos && text[first] == '[';
}

// A dataset file's text, counted, with invalid UTF-8 replaced (and counted).
std::string read_text_file(const std::string& file, SourceStats* st) {
  std::string text = read_file(file);
  ++st->files;
  if (size_t bad = find_invalid_utf8(text); bad != std::string::npos) {
    if (st->utf8_replaced == 0) {
      st->first_utf8 =
          where(file, 1 + std::count(text.begin(), text.begin() + static_cast<long>(bad), '\n'));
    }
    int64_t n = 0;
    text = HfTokenizer::sanitize_utf8(text, &n);
    st->utf8_replaced += n;
  }
  return text;
}

namespace {

// torchtitan's dataset names for C4, read from the files as they are on disk (JSON lines with a
// "text" field; the shards gzip-compressed).
struct C4Files {
  const char* name;
  const char* default_dir;  // torchtitan's default path, relative to the working directory
  const char* file;         // the file, or a glob of the shards, in that directory (or its en/)
  const char* what;
};
constexpr C4Files kC4[] = {
    {"c4", "allenai/c4", "c4-train.*-of-01024.json.gz", "C4's training shards"},
    {"c4_validation", "allenai/c4", "c4-validation.*-of-00008.json.gz", "C4's validation shards"},
    {"c4_test", "tests/assets/c4_test", "data.json",
     "torchtitan's c4_test file (the first 2,000 C4 documents)"},
};

const C4Files* c4_files(const std::string& dataset) {
  for (const auto& c : kC4)
    if (dataset == c.name) return &c;
  return nullptr;
}

// Whether pattern (a path or a glob) names at least one file.
bool matches(const std::string& pattern) {
  glob_t g{};
  const int rc = glob(pattern.c_str(), 0, nullptr, &g);
  const bool any = rc == 0 && g.gl_pathc > 0;
  globfree(&g);
  return any;
}

// The files a C4 name reads: dataset_path itself when it is a file, else its C4 files (in it or
// in its en/ folder, as the allenai/c4 repository holds them).
std::string c4_path(const SourceOptions& o, const C4Files& c) {
  const std::string dir = o.path.empty() ? c.default_dir : o.path;
  std::error_code ec;
  if (!o.path.empty() && fs::is_regular_file(dir, ec)) return dir;
  for (const std::string& sub : {std::string(), std::string("/en")}) {
    const std::string p = dir + sub + "/" + c.file;
    if (matches(p)) return p;
  }
  throw Error(o.section + ".dataset " + c.name + " reads " + c.what + " (" + c.file +
              ", JSON lines with a 'text' field) from a folder, and '" + dir + "' (nor its en/) " +
              (fs::is_directory(dir, ec) ? "holds none" : "does not exist") + "; set " + o.section +
              ".dataset_path to the folder holding them" +
              (std::string(c.name) == "c4_test"
                   ? " (tests/assets/c4_test of a torchtitan checkout)"
                   : " (a download of huggingface.co/datasets/allenai/c4, e.g. `hf download "
                     "allenai/c4 --repo-type dataset --include 'en/c4-train.0000*' --local-dir "
                     "DIR`)"));
}

}  // namespace

std::string effective_dataset(const SourceOptions& o) {
  if (c4_files(o.dataset)) return "jsonl";
  if (o.dataset != "auto") return o.dataset;
  if (o.path.empty()) return "fortunes";
  std::error_code ec;
  return fs::equivalent(o.path, kFortunesDir, ec) ? "fortunes" : "auto";
}

std::vector<std::string> path_items(const std::string& path) {
  std::vector<std::string> items;
  std::error_code ec;
  if (path.find(',') != std::string::npos && !fs::exists(path, ec)) {
    std::stringstream ss(path);
    std::string item;
    while (std::getline(ss, item, ',')) {
      const size_t a = item.find_first_not_of(" \t"), b = item.find_last_not_of(" \t");
      if (a != std::string::npos) items.push_back(item.substr(a, b - a + 1));
    }
  } else {
    items.push_back(path);
  }
  return items;
}

std::vector<std::string> resolve_paths(const std::string& path, const std::string& section) {
  std::error_code ec;
  std::vector<std::string> files;
  for (const auto& item : path_items(path)) {
    if (item.find_first_of("*?[") == std::string::npos || fs::exists(item, ec)) {
      add_path(item, section, &files);
      continue;
    }
    glob_t g{};
    const int rc = glob(item.c_str(), 0, nullptr, &g);
    std::vector<std::string> matches;
    if (rc == 0) {
      for (size_t i = 0; i < g.gl_pathc; ++i) matches.emplace_back(g.gl_pathv[i]);
    }
    globfree(&g);
    check(rc == 0 || rc == GLOB_NOMATCH, "cannot expand the dataset pattern '" + item + "'");
    check(!matches.empty(),
          "dataset pattern '" + item + "' matches no files; set " + section + ".dataset_path");
    for (const auto& m : matches) add_path(m, section, &files);
  }
  check(!files.empty(),
        "dataset path '" + path + "' holds no files; set " + section + ".dataset_path");
  return files;
}

std::vector<std::string> resolve_paths(const std::string& path) {
  return resolve_paths(path, "dataloader");
}

std::string file_format(const std::string& dataset, const std::string& file) {
  if (dataset == "jsonl" || dataset == "tokens") return dataset;
  if (dataset == "chat") return "jsonl";  // chat records are JSON lines (chat_dataset.h)
  // "x.jsonl.gz" reads as "x.jsonl" (gzip_file.h).
  std::string ext =
      fs::path(is_gzip_name(file) ? file.substr(0, file.size() - 3) : file).extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  if (ext == ".jsonl" || ext == ".json") return "jsonl";
  if (ext == ".bin") return "tokens";
  return dataset == "fortunes" ? "fortunes" : "text";
}

std::string source_path(const SourceOptions& o) {
  const std::string& d = o.dataset;
  if (const C4Files* c = c4_files(d)) return c4_path(o, *c);
  check(
      d == "fortunes" || d == "text" || d == "jsonl" || d == "tokens" || d == "chat" || d == "auto",
      o.section + ".dataset '" + d +
          "' is not a built-in source; use fortunes, text, jsonl, chat, tokens, auto, c4, "
          "c4_validation or c4_test");
  if (!o.path.empty()) return o.path;
  check(d == "fortunes" || d == "auto",
        o.section + ".dataset '" + d + "' needs " + o.section + ".dataset_path");
  std::error_code ec;
  check(fs::exists(kFortunesDir, ec),
        std::string("the fortunes corpus is missing at ") + kFortunesDir +
            "; install the Debian package 'fortunes' or set " + o.section + ".dataset_path");
  return kFortunesDir;
}

std::vector<std::string> read_documents(const SourceOptions& o, SourceStats* stats) {
  const auto corpus = open_text_corpus(o, "", stats);
  std::vector<std::string> docs(static_cast<size_t>(corpus->size()));
  for (size_t i = 0; i < docs.size(); ++i) corpus->text(static_cast<int64_t>(i), &docs[i]);
  return docs;
}

void read_json_records(const SourceOptions& o, SourceStats* st, const JsonRecordFn& fn) {
  *st = SourceStats{};
  const std::string path = source_path(o);
  for (const auto& file : resolve_paths(path, o.section)) {
    const std::string text = read_text_file(file, st);
    if (is_json_array_file(file, text)) {
      parse_json_array(text, file, fn);
      continue;
    }
    std::istringstream in(text);
    std::string line;
    for (int64_t lineno = 1; std::getline(in, line); ++lineno)
      if (!is_blank(line)) parse_json_line(line, file, lineno, o, st, fn);
  }
}

std::string skip_malformed_hint(const SourceOptions& o, const std::string& what) {
  return skip_hint(o, what);
}

std::string describe_problems(const SourceStats& s, const std::string& text_field) {
  std::string r;
  auto add = [&](const std::string& part) { r += (r.empty() ? "" : "; ") + part; };
  if (s.utf8_replaced > 0) {
    add("replaced " + std::to_string(s.utf8_replaced) +
        " invalid UTF-8 sequence(s) with U+FFFD (first at " + s.first_utf8 + ")");
  }
  if (s.malformed > 0) {
    add("skipped " + std::to_string(s.malformed) + " malformed JSON line(s) (first at " +
        s.first_malformed + ")");
  }
  if (s.missing_field > 0) {
    add("skipped " + std::to_string(s.missing_field) + " JSON line(s) without a string '" +
        text_field + "' field (first at " + s.first_missing + ")");
  }
  if (s.empty > 0) add("skipped " + std::to_string(s.empty) + " empty document(s)");
  return r;
}

std::vector<std::string> load_documents(const std::string& source, const std::string& path) {
  SourceOptions o;
  o.dataset = source;
  o.path = path;
  return read_documents(o);
}

}  // namespace titan::data
