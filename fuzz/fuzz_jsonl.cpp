// Fuzzes the JSONL corpus reader: one JSON record per line with a "text" field (malformed lines,
// wrong types, invalid UTF-8, a file holding one JSON array).
#include "fuzz_util.h"
#include "titan/data/text_source.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = titan::fuzz::write_input(data, size, "docs.jsonl");
  return titan::fuzz::expect_error_or_ok([&] {
    titan::data::SourceOptions o;
    o.dataset = "jsonl";
    o.path = path;
    (void)titan::data::read_documents(o);
    o.skip_malformed = true;
    (void)titan::data::read_documents(o);
  });
}
