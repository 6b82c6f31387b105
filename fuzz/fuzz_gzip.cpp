// Fuzzes the gzip reader (data/gzip_file.h) through the text corpus: the input, named .txt.gz, is
// indexed (inflated once, an access point at its start) and its documents are read back twice,
// in order (reading on from the last) and backwards (each from its access point); both must give
// the same text.
#include <cstdlib>

#include "fuzz_util.h"
#include "titan/data/text_corpus.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = titan::fuzz::write_input(data, size, "corpus.txt.gz");
  return titan::fuzz::expect_error_or_ok([&] {
    titan::data::SourceOptions o;
    o.dataset = "text";
    o.path = path;
    const auto corpus = titan::data::open_text_corpus(o, "");
    std::vector<std::string> forward(static_cast<size_t>(corpus->size()));
    for (int64_t i = 0; i < corpus->size(); ++i) corpus->text(i, &forward[static_cast<size_t>(i)]);
    std::string back;
    for (int64_t i = corpus->size() - 1; i >= 0; --i) {
      corpus->text(i, &back);
      if (back != forward[static_cast<size_t>(i)]) std::abort();  // the two reads disagree
    }
  });
}
