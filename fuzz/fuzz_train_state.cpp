// Fuzzes a checkpoint's data-loader position (train_state.json's "dataloader": cursor, order,
// epoch, carried tokens, seed) restored into a loader over a small corpus: every field checked
// against the dataset before use.
#include <cstdlib>
#include <memory>
#include <vector>

#include "fuzz_util.h"
#include "nlohmann/json.hpp"
#include "titan/data/dataset.h"
#include "titan/data/packed_loader.h"
#include "titan/data/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const nlohmann::json j = nlohmann::json::parse(data, data + size, nullptr, false);
  if (j.is_discarded()) return 0;  // train_state.json's JSON syntax is nlohmann's
  return titan::fuzz::expect_error_or_ok([&] {
    static const auto docs = std::make_shared<titan::data::TextDocuments>(
        std::vector<std::string>{"one document", "a second, longer document of text", "3", ""},
        titan::data::make_tokenizer("byte"));
    titan::data::LoaderOptions lo;
    lo.batch = 2;
    lo.seq_len = 8;
    lo.shuffle = true;
    titan::data::PackedLoader loader(docs, lo);
    if (const char* out = std::getenv("TITAN_FUZZ_WRITE_SEED")) {  // fuzz/seed: a real position
      std::vector<int32_t> in(16), lab(16), pos(16);
      loader.next(in.data(), lab.data(), pos.data());
      FILE* f = std::fopen(out, "w");
      std::fputs(nlohmann::json({{"dataloader", loader.state()}}).dump().c_str(), f);
      std::fclose(f);
    }
    loader.restore(j.contains("dataloader") ? j["dataloader"] : j);
    std::vector<int32_t> in(16), lab(16), pos(16);
    for (int i = 0; i < 3; ++i) loader.next(in.data(), lab.data(), pos.data());
  });
}
