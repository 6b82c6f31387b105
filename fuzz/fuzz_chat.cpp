// Fuzzes the chat records reader (dataloader.dataset chat): JSON lines of messages or prompt +
// completion (malformed lines and records, wrong types, unknown roles, invalid UTF-8, a file
// holding one JSON array), rendered, tokenized with the byte tokenizer, cut to a short length,
// and read back through the packed loader, packed and one conversation per row.
#include "fuzz_util.h"
#include "titan/data/chat_dataset.h"
#include "titan/data/packed_loader.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = titan::fuzz::write_input(data, size, "chat.jsonl");
  return titan::fuzz::expect_error_or_ok([&] {
    titan::data::SourceOptions o;
    o.dataset = "chat";
    o.path = path;
    (void)titan::data::is_chat_file(path);
    for (bool skip : {false, true}) {
      o.skip_malformed = skip;
      titan::data::ChatOptions c;
      c.max_tokens = 65;
      c.packing = skip;
      c.train_on_prompt = size % 2 == 1;
      auto docs =
          std::make_shared<titan::data::ChatDocuments>(o, c, titan::data::make_tokenizer("byte"));
      titan::data::LoaderOptions lo;
      lo.batch = 2;
      lo.seq_len = 64;
      lo.repeat = false;
      titan::data::PackedLoader l(docs, lo);
      std::vector<int32_t> in(128), lab(128), pos(128);
      while (l.next(in.data(), lab.data(), pos.data()) > 0) {
      }
    }
  });
}
