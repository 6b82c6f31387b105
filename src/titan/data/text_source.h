// Document sources. Formats: "fortunes" (records separated by lines holding only "%", the Debian
// fortunes package), "text" (one document per non-empty line, as the Hugging Face "text" loader)
// and "jsonl" (C4-style JSON lines: one object per line, the document in a configurable string
// field). A path is a file, a directory (its regular files, sorted), a glob(3) pattern, or a
// comma-separated list of those. With dataset "text", "fortunes" or "auto", files ending in .jsonl
// or .json are read as JSON lines and files ending in .bin are pre-tokenized shards ("auto" reads
// any other file as text; "auto" without a path is the fortunes corpus, read as fortunes); a file
// ending in .gz is read inflated, by the name without .gz (C4's c4-train.00000-of-01024.json.gz
// is JSON lines; gzip_file.h); "chat"
// reads every file as JSON lines of conversations (chat_dataset.h). A .json
// file holding one JSON array is read as that array's records (objects with the text field, or
// strings). Invalid UTF-8 is replaced by U+FFFD as Python's
// bytes.decode("utf-8", errors="replace") does, and counted; blank documents are skipped.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "nlohmann/json.hpp"

namespace titan::data {

// Default location of the fortunes corpus (Debian package fortunes).
inline constexpr const char* kFortunesDir = "/usr/share/games/fortunes";

struct SourceOptions {
  std::string dataset = "fortunes";    // fortunes | text | jsonl | chat | tokens | auto
  std::string path;                    // empty: the fortunes corpus (dataset fortunes or auto)
  std::string text_field = "text";     // the JSON field holding a document
  bool skip_malformed = false;         // skip (and count) bad JSON lines instead of failing
  std::string section = "dataloader";  // config section named in messages
  // How the user sets skip_malformed and text_field, for the hints in messages (the validator
  // shares the dataloader's; titan tokenize has flags).
  std::string skip_malformed_hint = "set dataloader.skip_malformed = true";
  std::string text_field_hint = "set dataloader.text_field";
};

// The dataset its files are read as: "fortunes" for "auto" on the fortunes corpus (no path),
// else o.dataset.
std::string effective_dataset(const SourceOptions& o);

// What reading found, for the one-line report.
struct SourceStats {
  int64_t files = 0, documents = 0, empty = 0;
  int64_t malformed = 0, missing_field = 0;  // JSON lines skipped under skip_malformed
  int64_t utf8_replaced = 0;                 // invalid UTF-8 sequences replaced by U+FFFD
  std::string first_malformed, first_missing, first_utf8;  // "file:line" of the first of each
};

// The items of a comma-separated path (each trimmed; one item when the path, commas and all,
// exists).
std::vector<std::string> path_items(const std::string& path);

// The files a path names, in order. Throws titan::Error naming a missing path or a pattern that
// matches nothing.
std::vector<std::string> resolve_paths(const std::string& path);
// The same; messages name `section`.dataset_path.
std::vector<std::string> resolve_paths(const std::string& path, const std::string& section);

// The format of one file under `dataset`: "fortunes", "text", "jsonl" or "tokens".
std::string file_format(const std::string& dataset, const std::string& file);

// The path option resolved (the fortunes default filled in), after checking the dataset name.
std::string source_path(const SourceOptions& o);

// Reads every text document. Throws titan::Error for an unknown dataset, a missing path, a
// malformed JSON line or missing field (file:line; unless skip_malformed), token shards among
// the files, or a source without documents.
std::vector<std::string> read_documents(const SourceOptions& o, SourceStats* stats = nullptr);

// One JSON record: its value, where it is ("file:line", or "file: element i" in a .json file
// holding one array) and what it is in messages ("line" or "element").
using JsonRecordFn =
    std::function<void(const nlohmann::json&, const std::string& at, const std::string& what)>;

// Every JSON record of the files o.path names, each file read as JSON lines (or as one array):
// invalid UTF-8 replaced and counted, blank lines skipped, a line that is not JSON an error
// naming file:line (or, with skip_malformed, skipped and counted). fn judges the records; *stats
// is reset first and counts files, replacements and malformed lines.
void read_json_records(const SourceOptions& o, SourceStats* stats, const JsonRecordFn& fn);

// " (or set dataloader.skip_malformed = true to skip and count such WHATs)", for messages.
std::string skip_malformed_hint(const SourceOptions& o, const std::string& what);

// The counts worth reporting ("" when there is nothing to report), one line.
std::string describe_problems(const SourceStats& s, const std::string& text_field);

// read_documents with the default options for `source` and `path`.
std::vector<std::string> load_documents(const std::string& source, const std::string& path);

// Byte offset of the first invalid UTF-8 sequence, or npos when valid.
size_t find_invalid_utf8(std::string_view s);

// Pieces of reading shared with text_corpus.h.
// Whether s holds only spaces, tabs and line ends (a blank document, skipped).
bool is_blank(std::string_view s);
// The document of one JSON record at `at` ("file:line", "file: element i"; `what` is "line" or
// "element"): its text field (or, strings_ok, the record itself when a string) into *text, true
// when not blank. A record without it is an error naming `at`, or under skip_malformed counted
// in *st (as a blank one is) and false.
bool json_document(const nlohmann::json& j, const std::string& at, const std::string& what,
                   const SourceOptions& o, bool strings_ok, SourceStats* st, std::string* text);
// One JSON line (line number lineno of file): its record to fn, or counted as malformed.
void parse_json_line(const std::string& line, const std::string& file, int64_t lineno,
                     const SourceOptions& o, SourceStats* st, const JsonRecordFn& fn);
// Whether file is a .json (or .json.gz) file whose text starts with '[' (one JSON array).
bool is_json_array_file(const std::string& file, std::string_view text);
// Every element of the JSON array in text (file's content) to fn.
void parse_json_array(const std::string& text, const std::string& file, const JsonRecordFn& fn);
// A dataset file's whole text (inflated when .gz), counted in *st, invalid UTF-8 replaced and
// counted.
std::string read_text_file(const std::string& file, SourceStats* st);

}  // namespace titan::data
