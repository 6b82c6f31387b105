// Chat fine-tuning data: the rendered conversations, their ids and the assistant-only labels
// against transformers (tests/fixtures/sft/chat_mask.json, tools/make_sft_fixtures.py) token for
// token; packed and one-per-row layouts; truncation and drop counts; malformed records (file:line,
// skip_malformed); detection under dataset auto; the loader's resume with a mask.
#include "titan/data/chat_dataset.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "test_util.h"
#include "titan/core/error.h"
#include "titan/data/chat_template.h"
#include "titan/data/packed_loader.h"

namespace titan::data {
namespace {

using nlohmann::json;
using titan::testing::error_of;

std::string write_lines(const std::string& dir, const std::string& name,
                        const std::vector<std::string>& lines) {
  const std::string p = dir + "/" + name;
  std::ofstream f(p);
  for (const auto& l : lines) f << l << "\n";
  return p;
}

SourceOptions source(const std::string& path) {
  SourceOptions o;
  o.dataset = "chat";
  o.path = path;
  return o;
}

std::string conv(const std::string& user, const std::string& assistant) {
  return json{
      {"messages",
       {{{"role", "user"}, {"content", user}}, {{"role", "assistant"}, {"content", assistant}}}}}
      .dump();
}

struct Rows {
  std::vector<int32_t> in, lab, pos;
  int64_t n = 0;
};

Rows next_rows(PackedLoader& l, int64_t batch, int64_t seq) {
  Rows r;
  r.in.resize(batch * seq);
  r.lab.resize(batch * seq);
  r.pos.resize(batch * seq);
  r.n = l.next(r.in.data(), r.lab.data(), r.pos.data());
  return r;
}

TEST(ChatDataset, IdsAndLabelsMatchTransformersTokenForToken) {
  const std::filesystem::path qwen = titan::testing::assets_dir() / "tokenizers/qwen3";
  if (!std::filesystem::exists(qwen / "tokenizer.json"))
    GTEST_SKIP() << "missing " << qwen.string() << " (set TITAN_ASSETS)";
  std::ifstream f(std::string(TITAN_SOURCE_DIR) + "/tests/fixtures/sft/chat_mask.json");
  const json fx = json::parse(f);
  const auto& cases = fx["cases"];
  std::vector<std::string> lines;
  for (const auto& c : cases) lines.push_back(c["record"].dump());
  const std::string dir = titan::testing::fresh_temp_dir("chat_parity");
  const auto tok = make_tokenizer(qwen.string());
  ChatStats st;
  auto docs = std::make_shared<ChatDocuments>(source(write_lines(dir, "f.jsonl", lines)),
                                              ChatOptions{}, tok, &st);
  ASSERT_EQ(docs->size(), static_cast<int64_t>(cases.size()));
  int64_t tokens = 0, trained = 0, max_len = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto& c = cases[i];
    // The segments render the same text as the formatter and transformers.
    if (c["record"].contains("messages")) {
      const auto msgs = chat_messages(c["record"]["messages"], "case");
      std::string text;
      for (const auto& s : qwen3_chat_segments(msgs)) text += s.text;
      EXPECT_EQ(text, c["text"].get<std::string>()) << i;
      EXPECT_EQ(qwen3_chat_format(msgs, false, true), text) << i;
    }
    std::vector<int32_t> ids, whole;
    std::vector<uint8_t> mask;
    docs->trained_tokens(static_cast<int64_t>(i), &ids, &mask);
    // Segments tokenized apart give the ids of the whole text, and transformers' ids.
    tok->encode(c["text"].get<std::string>(), false, false, &whole);
    EXPECT_EQ(ids, whole) << i << ": " << c["record"].dump();
    EXPECT_EQ(ids, c["ids"].get<std::vector<int32_t>>()) << i << ": " << c["record"].dump();
    EXPECT_EQ(std::vector<int>(mask.begin(), mask.end()), c["trained"].get<std::vector<int>>())
        << i << ": " << c["record"].dump();
    tokens += static_cast<int64_t>(ids.size());
    for (auto m : mask) trained += m;
    max_len = std::max<int64_t>(max_len, static_cast<int64_t>(ids.size()));
  }
  // The loader's labels, one conversation per row.
  auto unpacked = ChatOptions{};
  unpacked.packing = false;
  auto rows = std::make_shared<ChatDocuments>(source(dir + "/f.jsonl"), unpacked, tok);
  LoaderOptions lo;
  lo.batch = 1;
  lo.seq_len = max_len;
  lo.shuffle = false;
  lo.repeat = false;
  PackedLoader loader(rows, lo);
  int64_t labels = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    Rows r = next_rows(loader, 1, max_len);
    ASSERT_EQ(r.n, 1) << i;
    std::vector<int32_t> want = cases[i]["labels"].get<std::vector<int32_t>>();
    labels += static_cast<int64_t>(want.size());
    want.resize(static_cast<size_t>(max_len), -100);
    EXPECT_EQ(r.lab, want) << i;
  }
  EXPECT_EQ(next_rows(loader, 1, max_len).n, 0);
  std::printf(
      "parity: %zu conversations, %lld ids (%lld trained), %lld labels equal to "
      "transformers' (%s)\n",
      cases.size(), static_cast<long long>(tokens), static_cast<long long>(trained),
      static_cast<long long>(labels), fx["transformers"].get<std::string>().c_str());
  EXPECT_EQ(st.tokens, tokens);
}

TEST(ChatDataset, PackedRowsRestartPositionsAndMaskThePrompt) {
  const std::string dir = titan::testing::fresh_temp_dir("chat_packed");
  const std::string p = write_lines(dir, "c.jsonl", {conv("ab", "cd"), conv("e", "fgh")});
  auto docs = std::make_shared<ChatDocuments>(source(p), ChatOptions{}, make_tokenizer("byte"));
  std::vector<int32_t> ids0, ids1;
  std::vector<uint8_t> m0, m1;
  docs->trained_tokens(0, &ids0, &m0);
  docs->trained_tokens(1, &ids1, &m1);
  // byte ids: the rendered text's bytes, no BOS/EOS; the trained ids spell "cd<|im_end|>".
  const std::string t0 =
      "<|im_start|>user\nab<|im_end|>\n<|im_start|>assistant\n<think>\n\n</"
      "think>\n\ncd<|im_end|>\n";
  ASSERT_EQ(ids0.size(), t0.size());
  std::string trained;
  for (size_t i = 0; i < ids0.size(); ++i)
    if (m0[i]) trained += static_cast<char>(ids0[i]);
  EXPECT_EQ(trained, "<think>\n\n</think>\n\ncd<|im_end|>");

  LoaderOptions lo;
  lo.batch = 1;
  lo.seq_len = static_cast<int64_t>(ids0.size() + ids1.size()) - 2;  // both, exactly
  lo.shuffle = false;
  PackedLoader l(docs, lo);
  Rows r = next_rows(l, 1, lo.seq_len);
  const size_t n0 = ids0.size() - 1;
  for (size_t j = 0; j < static_cast<size_t>(lo.seq_len); ++j) {
    const bool first = j < n0;
    const size_t k = first ? j : j - n0;
    const auto& ids = first ? ids0 : ids1;
    const auto& m = first ? m0 : m1;
    EXPECT_EQ(r.in[j], ids[k]) << j;
    EXPECT_EQ(r.pos[j], static_cast<int32_t>(k)) << j;
    EXPECT_EQ(r.lab[j], m[k + 1] ? ids[k + 1] : -100) << j;
  }
}

TEST(ChatDataset, OneConversationPerRowIsPaddedWithCausalPositions) {
  const std::string dir = titan::testing::fresh_temp_dir("chat_rows");
  const std::string p =
      write_lines(dir, "c.jsonl", {conv("ab", "cd"), conv("e", "fgh"), conv("x", "y")});
  ChatOptions o;
  o.packing = false;
  auto docs = std::make_shared<ChatDocuments>(source(p), o, make_tokenizer("byte"));
  LoaderOptions lo;
  lo.batch = 2;
  lo.seq_len = 96;
  lo.shuffle = false;
  PackedLoader l(docs, lo);
  for (int b = 0; b < 3; ++b) {
    Rows r = next_rows(l, 2, 96);
    for (int row = 0; row < 2; ++row) {
      const int64_t d = (b * 2 + row) % 3;
      std::vector<int32_t> ids;
      std::vector<uint8_t> m;
      docs->trained_tokens(d, &ids, &m);
      for (size_t j = 0; j < 96; ++j) {
        const size_t at = static_cast<size_t>(row) * 96 + j;
        EXPECT_EQ(r.pos[at], static_cast<int32_t>(j));
        if (j + 1 < ids.size()) {
          EXPECT_EQ(r.in[at], ids[j]);
          EXPECT_EQ(r.lab[at], m[j + 1] ? ids[j + 1] : -100);
        } else {
          EXPECT_EQ(r.in[at], 0) << "padding input";
          EXPECT_EQ(r.lab[at], -100) << "padding label";
        }
      }
    }
  }
}

// Best-fit packing: whole conversations fill rows (none split, each once), longest first into the
// fullest row that fits; the loader restarts positions at each and never labels across two, and
// pads the rest of the row; far less padding than one conversation per row.
TEST(ChatDataset, BestFitPackingKeepsConversationsWhole) {
  const std::string dir = titan::testing::fresh_temp_dir("chat_bfd");
  std::vector<std::string> lines;
  for (int i = 0; i < 60; ++i)
    lines.push_back(conv(std::string(1 + (i * 7) % 23, 'u'), std::string(1 + (i * 13) % 37, 'a')));
  const std::string p = write_lines(dir, "c.jsonl", lines);
  const int64_t seq = 256;
  ChatOptions o;
  o.max_tokens = seq + 1;
  auto bfd = std::make_shared<ChatDocuments>(source(p), o, make_tokenizer("byte"));
  o.packing = false;
  auto one = std::make_shared<ChatDocuments>(source(p), o, make_tokenizer("byte"));
  ASSERT_EQ(bfd->conversations(), 60);
  ASSERT_FALSE(bfd->packed());
  std::vector<int> seen(60, 0);
  int64_t total = 0;
  for (int64_t r = 0; r < bfd->size(); ++r) {
    int64_t fill = 0;
    for (int64_t k = 0; k < bfd->parts(r); ++k) {
      std::vector<int32_t> ids;
      std::vector<uint8_t> m;
      bfd->part_tokens(r, k, &ids, &m);
      fill += static_cast<int64_t>(ids.size()) - 1;
      // Which conversation: the same ids as one of the one-per-row documents.
      for (int64_t c = 0; c < 60; ++c) {
        std::vector<int32_t> x;
        one->tokens(c, &x);
        if (x == ids) {
          ++seen[static_cast<size_t>(c)];
          break;
        }
      }
    }
    EXPECT_LE(fill, seq) << "row " << r;
    total += fill;
  }
  EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), 60) << "every conversation once, whole";
  const int64_t lower = (total + seq - 1) / seq;
  // Best-fit decreasing uses at most 11/9 of the optimal rows + 6/9 (Dosa 2007); the optimum is
  // at least the bound.
  EXPECT_LE(bfd->size(), (11 * lower + 6) / 9 + 1);
  EXPECT_NEAR(bfd->padding_share(), 1.0 - static_cast<double>(total) / (bfd->size() * seq), 1e-12);
  std::printf(
      "best-fit: %lld conversations in %lld rows of %lld (bound %lld), padding %.1f%%; "
      "one per row: padding %.1f%%\n",
      60LL, static_cast<long long>(bfd->size()), static_cast<long long>(seq),
      static_cast<long long>(lower), 100 * bfd->padding_share(),
      100.0 * (1.0 - static_cast<double>(total) / (60.0 * seq)));

  LoaderOptions lo;
  lo.batch = 1;
  lo.seq_len = seq;
  lo.shuffle = false;
  PackedLoader l(bfd, lo);
  for (int64_t r = 0; r < bfd->size(); ++r) {
    const Rows got = next_rows(l, 1, seq);
    size_t at = 0;
    for (int64_t k = 0; k < bfd->parts(r); ++k) {
      std::vector<int32_t> ids;
      std::vector<uint8_t> m;
      bfd->part_tokens(r, k, &ids, &m);
      for (size_t j = 0; j + 1 < ids.size(); ++j, ++at) {
        ASSERT_EQ(got.in[at], ids[j]) << r << " " << k << " " << j;
        ASSERT_EQ(got.pos[at], static_cast<int32_t>(j));
        ASSERT_EQ(got.lab[at], m[j + 1] ? ids[j + 1] : -100) << "a label crosses conversations";
      }
    }
    for (; at < static_cast<size_t>(seq); ++at) {
      ASSERT_EQ(got.lab[at], -100);
      ASSERT_EQ(got.pos[at], got.pos[at - 1] + 1) << "padding positions count on";
    }
  }
  // The loader's state holds such rows and resumes.
  const nlohmann::json st = l.state();
  const Rows a = next_rows(l, 1, seq);
  PackedLoader m2(bfd, lo);
  m2.restore(st);
  const Rows b = next_rows(m2, 1, seq);
  EXPECT_EQ(a.in, b.in);
  EXPECT_EQ(a.pos, b.pos);
}

TEST(ChatDataset, LongConversationsAreTruncatedOrDroppedAndCounted) {
  const std::string dir = titan::testing::fresh_temp_dir("chat_long");
  // The header before the assistant text is 51 bytes with "u"; 200 trained bytes follow.
  const std::string p = write_lines(
      dir, "c.jsonl",
      {conv("u", std::string(200, 'a')), conv("u", "b"), conv(std::string(300, 'u'), "c")});
  const auto tok = make_tokenizer("byte");
  ChatOptions o;
  o.max_tokens = 101;
  ChatStats st;
  ChatDocuments t(source(p), o, tok, &st);
  EXPECT_EQ(st.records, 3);
  EXPECT_EQ(st.truncated, 2);
  EXPECT_EQ(st.dropped_untrained, 1);  // its assistant turn lies past the cut
  EXPECT_EQ(t.size(), 2);
  std::vector<int32_t> ids;
  t.tokens(0, &ids);
  EXPECT_EQ(ids.size(), 101u);
  const std::string line = describe_chat_problems(st, o);
  EXPECT_NE(line.find("2 of 3 conversations longer than 101 tokens (training.seq_len + 1) "
                      "truncated"),
            std::string::npos)
      << line;
  EXPECT_NE(line.find("dropped 1 of 3 conversations with no trained token"), std::string::npos)
      << line;

  o.truncation = "drop";
  ChatDocuments d(source(p), o, tok, &st);
  EXPECT_EQ(st.dropped_long, 2);
  EXPECT_EQ(st.truncated, 0);
  EXPECT_EQ(d.size(), 1);
  EXPECT_NE(describe_chat_problems(st, o).find("2 of 3 conversations longer than 101 tokens"),
            std::string::npos);

  o.max_tokens = 20;  // nothing fits: one error naming what happened
  const std::string err = error_of([&] { ChatDocuments(source(p), o, tok); });
  EXPECT_NE(err.find("has no conversations to train on (3 of 3 conversations longer than 20"),
            std::string::npos)
      << err;
}

TEST(ChatDataset, MalformedRecordsNameFileAndLineOrAreSkippedAndCounted) {
  const std::string dir = titan::testing::fresh_temp_dir("chat_bad");
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"[1, 2]", "the record is not a JSON object"},
      {R"({"text": "hi"})", "no \"messages\" (nor \"prompt\" and \"completion\")"},
      {R"({"messages": [{"role": "robot", "content": "x"}]})", "unknown role 'robot'"},
      {R"({"messages": [{"role": "user", "content": 3}]})", "needs a string 'content'"},
      {R"({"messages": [{"role": "user", "content": "x"}]})", "no assistant turn"},
      {R"({"prompt": "x", "completion": [{"role": "assistant", "content": "y"}]})",
       "must be both strings or both message lists"},
      {R"({"prompt": [{"role": "user", "content": "x"}], "completion": [{"role": "user", "content": "y"}]})",
       "the completion holds no assistant turn"},
      {R"({"messages": [)", "malformed JSON"},
  };
  const auto tok = make_tokenizer("byte");
  for (const auto& [line, want] : bad) {
    const std::string p = write_lines(dir, "c.jsonl", {conv("a", "b"), line});
    const std::string err = error_of([&] { ChatDocuments(source(p), ChatOptions{}, tok); });
    EXPECT_NE(err.find(p + ":2"), std::string::npos) << err;
    EXPECT_NE(err.find(want), std::string::npos) << "want '" << want << "' in: " << err;
    EXPECT_NE(err.find("dataloader.skip_malformed"), std::string::npos) << err;
    EXPECT_EQ(err.find('\n'), std::string::npos) << err;
  }
  std::vector<std::string> lines = {conv("a", "b")};
  for (const auto& [line, want] : bad) lines.push_back(line);
  SourceOptions o = source(write_lines(dir, "all.jsonl", lines));
  o.skip_malformed = true;
  ChatStats st;
  ChatDocuments d(o, ChatOptions{}, tok, &st);
  EXPECT_EQ(d.size(), 1);
  EXPECT_EQ(st.bad_records, 7);
  EXPECT_EQ(st.first_bad, o.path + ":2");
  EXPECT_EQ(st.source.malformed, 1);  // the line that is not JSON
  EXPECT_NE(describe_chat_problems(st, ChatOptions{}).find("skipped 7 malformed chat record(s)"),
            std::string::npos);
}

TEST(ChatDataset, TrainOnPromptTrainsEveryToken) {
  const std::string dir = titan::testing::fresh_temp_dir("chat_all");
  const std::string p = write_lines(
      dir, "c.jsonl",
      {conv("a", "b"), R"({"messages": [{"role": "user", "content": "only a question"}]})"});
  ChatOptions o;
  o.train_on_prompt = true;
  ChatDocuments d(source(p), o, make_tokenizer("byte"));
  ASSERT_EQ(d.size(), 2);
  for (int64_t i = 0; i < 2; ++i) {
    std::vector<int32_t> ids;
    std::vector<uint8_t> m;
    d.trained_tokens(i, &ids, &m);
    EXPECT_EQ(std::count(m.begin(), m.end(), 1), static_cast<long>(ids.size()));
  }
}

TEST(ChatDataset, PlainPromptCompletionTrainsTheCompletionAndEos) {
  const std::string dir = titan::testing::fresh_temp_dir("chat_plain");
  const std::string p =
      write_lines(dir, "c.jsonl", {R"({"prompt": "Q: 1+1?", "completion": " A: 2"})"});
  ChatDocuments d(source(p), ChatOptions{}, make_tokenizer("byte"));
  std::vector<int32_t> ids;
  std::vector<uint8_t> m;
  d.trained_tokens(0, &ids, &m);
  ASSERT_EQ(ids.size(), 7u + 5u + 1u);  // no BOS; the completion, then EOS
  EXPECT_EQ(ids.back(), 257);
  EXPECT_EQ(std::vector<uint8_t>(m.begin(), m.begin() + 7), std::vector<uint8_t>(7, 0));
  EXPECT_EQ(std::vector<uint8_t>(m.begin() + 7, m.end()), std::vector<uint8_t>(6, 1));
}

TEST(ChatDataset, AutoDetectsChatRecords) {
  const std::string dir = titan::testing::fresh_temp_dir("chat_auto");
  DatasetSpec s;
  s.source.dataset = "auto";
  s.source.path = write_lines(dir, "c.jsonl", {conv("a", "b")});
  EXPECT_NE(dynamic_cast<const ChatDocuments*>(open_dataset(s).get()), nullptr);
  s.source.path = write_lines(dir, "p.json", {R"([{"prompt": "x", "completion": "y"}])"});
  EXPECT_NE(dynamic_cast<const ChatDocuments*>(open_dataset(s).get()), nullptr);
  s.source.path = write_lines(dir, "t.jsonl", {R"({"text": "plain text"})"});
  EXPECT_NE(dynamic_cast<const TextDocuments*>(open_dataset(s).get()), nullptr);
  EXPECT_FALSE(is_chat_file(write_lines(dir, "x.txt", {conv("a", "b")})));
}

TEST(ChatDataset, LoaderResumesExactlyPackedOrNot) {
  const std::string dir = titan::testing::fresh_temp_dir("chat_resume");
  std::vector<std::string> lines;
  for (int i = 0; i < 9; ++i) {
    std::string q(static_cast<size_t>(i) + 1, 'x'), a = "answer ";
    a += std::to_string(i);
    lines.push_back(conv(q, a));
  }
  const std::string p = write_lines(dir, "c.jsonl", lines);
  for (bool packing : {true, false}) {
    ChatOptions o;
    o.packing = packing;
    auto docs = std::make_shared<ChatDocuments>(source(p), o, make_tokenizer("byte"));
    LoaderOptions lo;
    lo.batch = 2;
    lo.seq_len = packing ? 40 : 128;
    lo.seed = 3;
    PackedLoader a(docs, lo), b(docs, lo);
    for (int i = 0; i < 11; ++i) next_rows(a, lo.batch, lo.seq_len);
    ASSERT_GE(a.epoch(), 1);
    const json s = a.state();
    b.restore(json::parse(s.dump()));
    for (int i = 0; i < 6; ++i) {
      Rows x = next_rows(a, lo.batch, lo.seq_len), y = next_rows(b, lo.batch, lo.seq_len);
      EXPECT_EQ(x.in, y.in) << packing << " " << i;
      EXPECT_EQ(x.lab, y.lab) << packing << " " << i;
      EXPECT_EQ(x.pos, y.pos) << packing << " " << i;
    }
    // A state of the other layout is refused.
    o.packing = !packing;
    PackedLoader c(std::make_shared<ChatDocuments>(source(p), o, make_tokenizer("byte")), lo);
    EXPECT_NE(error_of([&] { c.restore(s); }).find("saved with sft.packing"), std::string::npos);
  }
}

TEST(DocumentSet, TextDocumentsTrainEveryToken) {
  TextDocuments t({"hello"}, make_tokenizer("byte"));
  EXPECT_FALSE(t.has_mask());
  EXPECT_TRUE(t.packed());
  std::vector<int32_t> ids;
  std::vector<uint8_t> m;
  t.trained_tokens(0, &ids, &m);
  EXPECT_EQ(ids.size(), 7u);
  EXPECT_EQ(m, std::vector<uint8_t>(7, 1));
}

}  // namespace
}  // namespace titan::data
