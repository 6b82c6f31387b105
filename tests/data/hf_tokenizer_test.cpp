// HfTokenizer against the Hugging Face `tokenizers` library: every document of the fixture
// corpora (tests/fixtures/tokenizer/expected.json, written by tools/make_tokenizer_fixtures.py)
// must give the same ids; plus decoding, BOS/EOS, refusals and UTF-8 sanitizing. Needs the
// shared assets ($TITAN_ASSETS, else <repo>/../shared/assets).
#include "titan/data/hf_tokenizer.h"

#include <gtest/gtest.h>
#include <unistd.h>
#include <utf8proc.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "titan/core/error.h"

namespace titan::data {
namespace {
namespace fs = std::filesystem;
using json = nlohmann::json;

// ---- helpers --------------------------------------------------------------------------------

// SHA-256 (FIPS 180-4), enough for fixture hashes.
std::string sha256_hex(const void* data, size_t n) {
  static const uint32_t k[64] = {
      0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
      0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
      0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
      0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
      0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
      0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
      0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
      0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
      0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
      0xc67178f2};
  uint32_t h[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  std::string msg(static_cast<const char*>(data), n);
  msg.push_back(static_cast<char>(0x80));
  while (msg.size() % 64 != 56) msg.push_back(0);
  const uint64_t bits = static_cast<uint64_t>(n) * 8;
  for (int i = 7; i >= 0; --i) msg.push_back(static_cast<char>((bits >> (8 * i)) & 0xff));
  auto rotr = [](uint32_t x, int r) { return (x >> r) | (x << (32 - r)); };
  for (size_t off = 0; off < msg.size(); off += 64) {
    uint32_t w[64];
    for (int i = 0; i < 16; ++i) {
      const auto* p = reinterpret_cast<const unsigned char*>(msg.data() + off + 4 * i);
      w[i] = (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
    }
    for (int i = 16; i < 64; ++i) {
      const uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
      const uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
      w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
    for (int i = 0; i < 64; ++i) {
      const uint32_t t1 =
          hh + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + k[i] + w[i];
      const uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
      hh = g;
      g = f;
      f = e;
      e = d + t1;
      d = c;
      c = b;
      b = a;
      a = t1 + t2;
    }
    h[0] += a, h[1] += b, h[2] += c, h[3] += d, h[4] += e, h[5] += f, h[6] += g, h[7] += hh;
  }
  char hex[65];
  for (int i = 0; i < 8; ++i) std::snprintf(hex + 8 * i, 9, "%08x", h[i]);
  return std::string(hex, 64);
}

// The fixtures' id hash: sha256 of the ids as little-endian int32, first 16 hex digits.
std::string ids_hash(const std::vector<int32_t>& ids) {
  std::string bytes;
  bytes.reserve(ids.size() * 4);
  for (int32_t id : ids) {
    const auto u = static_cast<uint32_t>(id);
    for (int s = 0; s < 32; s += 8) bytes.push_back(static_cast<char>((u >> s) & 0xff));
  }
  return sha256_hex(bytes.data(), bytes.size()).substr(0, 16);
}

std::string docs_hash(const std::vector<std::string>& docs) {
  std::string bytes;
  for (const std::string& d : docs) {
    const uint64_t n = d.size();
    for (int s = 0; s < 64; s += 8) bytes.push_back(static_cast<char>((n >> s) & 0xff));
    bytes += d;
  }
  return sha256_hex(bytes.data(), bytes.size()).substr(0, 16);
}

std::string base64_decode(const std::string& in) {
  auto val = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  std::string out;
  uint32_t acc = 0;
  int bits = 0;
  for (char c : in) {
    const int v = val(c);
    if (v < 0) continue;
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((acc >> bits) & 0xff));
    }
  }
  return out;
}

std::string nfc(const std::string& s) {
  utf8proc_uint8_t* dst = nullptr;
  const utf8proc_ssize_t n = utf8proc_map(
      reinterpret_cast<const utf8proc_uint8_t*>(s.data()), static_cast<utf8proc_ssize_t>(s.size()),
      &dst, static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  std::string out = n < 0 ? s : std::string(reinterpret_cast<char*>(dst), static_cast<size_t>(n));
  std::free(dst);
  return out;
}

fs::path assets_dir() {
  if (const char* env = std::getenv("TITAN_ASSETS"); env && *env) return env;
  return fs::path(TITAN_SOURCE_DIR) / ".." / "shared" / "assets";
}

// Path of a required asset; the test fails with the path when it is absent.
fs::path asset(const std::string& rel) {
  fs::path p = assets_dir() / rel;
  if (!fs::exists(p)) {
    throw std::runtime_error("missing test asset " + p.string() +
                             " (set TITAN_ASSETS to the shared assets directory)");
  }
  return p;
}

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) throw std::runtime_error("cannot read " + p.string());
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

const json& expected() {
  static const json j =
      json::parse(slurp(fs::path(TITAN_SOURCE_DIR) / "tests/fixtures/tokenizer/expected.json"));
  return j;
}

class TempDir {
 public:
  TempDir() {
    static int counter = 0;
    path_ = fs::temp_directory_path() /
            ("titan_hf_tok_" + std::to_string(getpid()) + "_" + std::to_string(counter++));
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }
  void write(const std::string& name, const std::string& text) const {
    std::ofstream(path_ / name) << text;
  }

 private:
  fs::path path_;
};

// Tokenizers are loaded once per process (Qwen3's 11 MB tokenizer.json takes a moment).
const HfTokenizer& tokenizer(const std::string& rel_dir) {
  static std::map<std::string, std::unique_ptr<HfTokenizer>> cache;
  auto& t = cache[rel_dir];
  if (!t) t = std::make_unique<HfTokenizer>(HfTokenizer::load(asset(rel_dir).string()));
  return *t;
}

// The tokenizer of a fixture corpus: an asset directory, or a tokenizer.json stored inline.
const HfTokenizer& tokenizer_of(const json& corpus) {
  if (!corpus.contains("tokenizer_json")) return tokenizer(corpus["tokenizer"]);
  static std::map<std::string, std::unique_ptr<HfTokenizer>> cache;
  auto& t = cache[corpus["name"]];
  if (!t) {
    TempDir dir;
    dir.write("tokenizer.json", corpus["tokenizer_json"].dump());
    t = std::make_unique<HfTokenizer>(HfTokenizer::load(dir.path().string()));
  }
  return *t;
}

struct Corpus {
  std::vector<std::string> docs;
  std::vector<int64_t> replaced;  // edge cases: U+FFFD substitutions
  std::vector<std::string> raw;   // edge cases: the bytes before sanitizing
};

// Rebuilds a corpus exactly as tools/make_tokenizer_fixtures.py splits it.
Corpus read_corpus(const json& c) {
  const std::string fmt = c["format"], source = c["source"];
  Corpus out;
  if (fmt == "paragraphs") {
    const std::string text = slurp(asset(source));
    size_t pos = 0;
    while (pos <= text.size()) {
      size_t next = text.find("\n\n", pos);
      if (next == std::string::npos) next = text.size();
      if (next > pos) out.docs.push_back(text.substr(pos, next - pos));
      pos = next + 2;
    }
    return out;
  }
  const std::string text =
      slurp(fmt == "edge_cases" ? fs::path(TITAN_SOURCE_DIR) / source : asset(source));
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.empty()) continue;
    json rec = json::parse(line);
    if (fmt == "jsonl") {
      out.docs.push_back(rec["text"]);
    } else if (rec.contains("bytes_b64")) {
      out.raw.push_back(base64_decode(rec["bytes_b64"]));
      int64_t n = 0;
      out.docs.push_back(HfTokenizer::sanitize_utf8(out.raw.back(), &n));
      out.replaced.push_back(n);
    } else {
      out.docs.push_back(rec["text"]);
      out.raw.push_back(out.docs.back());
      out.replaced.push_back(0);
    }
  }
  return out;
}

std::string show_ids(const std::vector<int32_t>& ids, size_t at) {
  std::string s;
  const size_t lo = at >= 3 ? at - 3 : 0;
  for (size_t i = lo; i < std::min(ids.size(), at + 4); ++i)
    s.append(i == at ? "[" : "").append(std::to_string(ids[i])).append(i == at ? "] " : " ");
  return s;
}

// ---- parity ---------------------------------------------------------------------------------

TEST(HfTokenizer, SameIdsAsTokenizersOnEveryDocument) {
  const json& e = expected();
  ASSERT_TRUE(e.contains("corpora"));
  for (const json& c : e["corpora"]) {
    const std::string name = c["name"];
    SCOPED_TRACE(name);
    const HfTokenizer& tok = tokenizer_of(c);
    const Corpus corpus = read_corpus(c);
    ASSERT_EQ(static_cast<int64_t>(corpus.docs.size()), c["num_docs"].get<int64_t>());
    ASSERT_EQ(docs_hash(corpus.docs), c["docs_sha256"].get<std::string>())
        << "the documents differ from the ones the fixture was made from";
    const int64_t n = static_cast<int64_t>(corpus.docs.size());
    std::vector<std::vector<int32_t>> ids(static_cast<size_t>(n));
    // In parallel: also exercises concurrent use of one tokenizer (shared BPE cache).
#pragma omp parallel for schedule(dynamic, 4)
    for (int64_t i = 0; i < n; ++i)
      ids[static_cast<size_t>(i)] = tok.encode(corpus.docs[static_cast<size_t>(i)], false, false);
    int64_t matched = 0, reported = 0;
    for (size_t i = 0; i < ids.size(); ++i) {
      const std::vector<int32_t>& got = ids[i];
      const bool same = static_cast<int64_t>(got.size()) == c["counts"][i].get<int64_t>() &&
                        ids_hash(got) == c["sha256"][i].get<std::string>();
      if (same) {
        ++matched;
        continue;
      }
      if (++reported > 5) continue;
      std::string where = "hash differs after the stored ids";
      if (i < c["ids"].size()) {
        const std::vector<int32_t> want = c["ids"][i].get<std::vector<int32_t>>();
        size_t k = 0;
        while (k < got.size() && k < want.size() && got[k] == want[k]) ++k;
        if (k < want.size() || (k < got.size() && want.size() == c["counts"][i].get<size_t>())) {
          where = "first difference at id " + std::to_string(k) + ": got " + show_ids(got, k) +
                  "want " + show_ids(want, k);
        }
      }
      ADD_FAILURE() << name << " document " << i << ": " << got.size() << " ids, want "
                    << c["counts"][i] << "; " << where;
    }
    std::printf("[ parity   ] %-28s %lld / %lld documents identical\n", name.c_str(),
                static_cast<long long>(matched), static_cast<long long>(n));
    EXPECT_EQ(matched, n);
  }
}

TEST(HfTokenizer, DecodeMatchesTokenizersAndRoundTrips) {
  for (const json& c : expected()["corpora"]) {
    if (c["format"] != "edge_cases") continue;
    SCOPED_TRACE(c["name"].get<std::string>());
    const HfTokenizer& tok = tokenizer_of(c);
    const Corpus corpus = read_corpus(c);
    for (size_t i = 0; i < corpus.docs.size(); ++i) {
      SCOPED_TRACE(c["names"][i].get<std::string>());
      const auto want_ids = c["ids"][i].get<std::vector<int32_t>>();
      const std::string decoded = c["decoded"][i], want_nfc = c["nfc"][i];
      EXPECT_EQ(tok.decode(want_ids), decoded);
      // decode(encode(x)) == NFC(x) whenever the library round-trips (no special tokens, and
      // for tiny-bpe-2k, whose vocabulary lacks most bytes, almost never).
      if (decoded == want_nfc) {
        EXPECT_EQ(tok.decode(tok.encode(corpus.docs[i], false, false)), want_nfc);
      }
    }
  }
  // Whole corpora round-trip through the Qwen3 tokenizer.
  const HfTokenizer& qwen = tokenizer("tokenizers/qwen3");
  for (const json& c : expected()["corpora"]) {
    if (c["tokenizer"] != "tokenizers/qwen3" || c["format"] == "edge_cases") continue;
    for (const std::string& d : read_corpus(c).docs)
      ASSERT_EQ(qwen.decode(qwen.encode(d, false, false)), nfc(d)) << c["name"];
  }
}

TEST(HfTokenizer, SanitizesInvalidUtf8LikePython) {
  for (const json& c : expected()["corpora"]) {
    if (c["name"] != "qwen3/edge_cases") continue;
    const Corpus corpus = read_corpus(c);
    int invalid = 0;
    for (size_t i = 0; i < corpus.docs.size(); ++i) {
      SCOPED_TRACE(c["names"][i].get<std::string>());
      EXPECT_EQ(corpus.replaced[i], c["replaced"][i].get<int64_t>());
      EXPECT_EQ(nfc(corpus.docs[i]), c["nfc"][i].get<std::string>());
      // encode() sanitizes by itself.
      EXPECT_EQ(tokenizer(c["tokenizer"]).encode(corpus.raw[i], false, false),
                c["ids"][i].get<std::vector<int32_t>>());
      invalid += corpus.replaced[i] > 0;
    }
    EXPECT_GE(invalid, 10);
  }
  int64_t n = -1;
  EXPECT_EQ(HfTokenizer::sanitize_utf8("plain", &n), "plain");
  EXPECT_EQ(n, 0);
  EXPECT_EQ(HfTokenizer::sanitize_utf8("a\xff\xfe!", &n), "a\xEF\xBF\xBD\xEF\xBF\xBD!");
  EXPECT_EQ(n, 2);
  EXPECT_EQ(HfTokenizer::sanitize_utf8("\xe2\x82", &n), "\xEF\xBF\xBD");  // one maximal subpart
  EXPECT_EQ(n, 1);
  EXPECT_EQ(HfTokenizer::sanitize_utf8("\xe0\x80\xaf", &n), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(n, 3);
  EXPECT_EQ(HfTokenizer::sanitize_utf8("\xf0\x9f\x98\x80", &n), "\xf0\x9f\x98\x80");
  EXPECT_EQ(n, 0);
}

// ---- BOS / EOS, vocabulary ------------------------------------------------------------------

TEST(HfTokenizer, BosEosFollowTorchtitan) {
  const HfTokenizer& qwen = tokenizer("tokenizers/qwen3");
  EXPECT_EQ(qwen.vocab_size(), 151669);
  EXPECT_FALSE(qwen.bos_id().has_value());  // bos_token is null
  ASSERT_TRUE(qwen.eos_id().has_value());
  EXPECT_EQ(*qwen.eos_id(), 151645);  // eos_token <|im_end|>
  EXPECT_EQ(qwen.token_to_id("<|endoftext|>"), 151643);
  EXPECT_EQ(qwen.token_to_id("<think>"), 151667);
  EXPECT_EQ(qwen.token_to_id("Hello"), 9707);
  EXPECT_FALSE(qwen.token_to_id("no such token").has_value());
  const std::vector<int32_t> plain = qwen.encode("Hello world", false, false);
  EXPECT_EQ(plain, (std::vector<int32_t>{9707, 1879}));
  std::vector<int32_t> with = plain;
  with.push_back(151645);
  EXPECT_EQ(qwen.encode("Hello world", true, true), with);  // no BOS to add
  EXPECT_EQ(qwen.encode("Hello world", true, false), plain);
  std::vector<int32_t> appended = {7};
  qwen.encode_into("Hello world", false, true, &appended);
  EXPECT_EQ(appended, (std::vector<int32_t>{7, 9707, 1879, 151645}));
  // Special tokens are skipped; torchtitan registers every tokenizer_config.json token (<think>
  // included) as special.
  EXPECT_EQ(qwen.decode({151643, 9707, 151667, 9707}), "HelloHello");

  const HfTokenizer& tiny = tokenizer("tokenizers/tiny-bpe-2k");
  EXPECT_EQ(tiny.vocab_size(), 2020);
  EXPECT_EQ(tiny.bos_id(), 2002);
  EXPECT_EQ(tiny.eos_id(), 2003);
  const std::vector<int32_t> t = tiny.encode("Hi", false, false);
  std::vector<int32_t> both = {2002};
  both.insert(both.end(), t.begin(), t.end());
  both.push_back(2003);
  EXPECT_EQ(tiny.encode("Hi", true, true), both);
  EXPECT_EQ(tiny.encode("", true, true), (std::vector<int32_t>{2002, 2003}));
  // Config special tokens are registered (as torchtitan does), so they match in text.
  EXPECT_EQ(tiny.encode("<|begin_of_text|>", false, false), (std::vector<int32_t>{2002}));
}

json tiny_json() { return json::parse(slurp(asset("tokenizers/tiny-bpe-2k/tokenizer.json"))); }

TEST(HfTokenizer, TemplatePostProcessorBosIsNotDoubled) {
  TempDir dir;
  json j = tiny_json();
  j["post_processor"] = {
      {"type", "TemplateProcessing"},
      {"single", json::array({{{"SpecialToken", {{"id", "<|begin_of_text|>"}, {"type_id", 0}}}},
                              {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
      {"pair", json::array()},
      {"special_tokens",
       {{"<|begin_of_text|>",
         {{"id", "<|begin_of_text|>"}, {"ids", {2002}}, {"tokens", {"<|begin_of_text|>"}}}}}}};
  dir.write("tokenizer.json", j.dump());
  std::ofstream(dir.path() / "tokenizer_config.json")
      << slurp(asset("tokenizers/tiny-bpe-2k/tokenizer_config.json"));
  const HfTokenizer tok = HfTokenizer::load(dir.path().string());
  const std::vector<int32_t> plain = tokenizer("tokenizers/tiny-bpe-2k").encode("Hi", false, false);
  std::vector<int32_t> want = {2002};
  want.insert(want.end(), plain.begin(), plain.end());
  EXPECT_EQ(tok.encode("Hi", false, false), want);  // the template adds BOS itself
  EXPECT_EQ(tok.encode("Hi", true, false), want);   // ... so encode does not add another
  want.push_back(2003);
  EXPECT_EQ(tok.encode("Hi", true, true), want);
  // Loading the file itself finds tokenizer_config.json beside it.
  EXPECT_EQ(HfTokenizer::load((dir.path() / "tokenizer.json").string()).eos_id(), 2003);
}

// ---- refusals -------------------------------------------------------------------------------

std::string load_error(const fs::path& p) {
  try {
    HfTokenizer::load(p.string());
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(HfTokenizer, RefusesUnsupportedTokenizers) {
  TempDir dir;
  dir.write("tokenizer.json", R"({"version": "1.0", "added_tokens": [], "normalizer": null,
    "pre_tokenizer": {"type": "BertPreTokenizer"}, "post_processor": null, "decoder": null,
    "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
              "max_input_chars_per_word": 100, "vocab": {"[UNK]": 0, "a": 1, "##b": 2}}})");
  std::string msg = load_error(dir.path());
  EXPECT_NE(msg.find((dir.path() / "tokenizer.json").string()), std::string::npos) << msg;
  EXPECT_NE(msg.find("model.type"), std::string::npos) << msg;
  EXPECT_NE(msg.find("WordPiece"), std::string::npos) << msg;

  json j = tiny_json();
  j["normalizer"] = {{"type", "Lowercase"}};
  dir.write("tokenizer.json", j.dump());
  msg = load_error(dir.path());
  EXPECT_NE(msg.find("normalizer"), std::string::npos) << msg;
  EXPECT_NE(msg.find("Lowercase"), std::string::npos) << msg;

  j = tiny_json();
  j["pre_tokenizer"] = {{"type", "Whitespace"}};
  dir.write("tokenizer.json", j.dump());
  msg = load_error(dir.path());
  EXPECT_NE(msg.find("pre_tokenizer"), std::string::npos) << msg;

  j = tiny_json();
  j["model"]["type"] = "Unigram";
  dir.write("tokenizer.json", j.dump());
  EXPECT_NE(load_error(dir.path()).find("Unigram"), std::string::npos);

  dir.write("tokenizer.json", "{not json");
  EXPECT_NE(load_error(dir.path()).find("invalid JSON"), std::string::npos);
  // Found by fuzz_tokenizer_json: a number too large for a double is nlohmann's out_of_range,
  // not a parse_error; it ended the process (terminate) instead of this error.
  dir.write("tokenizer.json", "{\"version\": 488888E8888888888863}");
  EXPECT_NE(load_error(dir.path()).find("invalid JSON"), std::string::npos);
}

// tokenizer_config.json's added_tokens_decoder: an entry that is not a token (no string content,
// not an object) or a key that is not an id is refused naming the file and the entry, as
// Transformers refuses it; a bad flag names the flag.
TEST(HfTokenizer, MalformedAddedTokensDecoderIsRefused) {
  TempDir dir;
  dir.write("tokenizer.json", tiny_json().dump());
  const json good = json::parse(slurp(asset("tokenizers/tiny-bpe-2k/tokenizer_config.json")));
  const json token = {{"content", "<x>"}, {"special", true}};
  const std::vector<std::pair<json, std::string>> cases = {
      {{{"1998", "<|image|>"}}, "added_tokens_decoder[\"1998\"]: expected an object"},
      {{{"1998", {{"special", true}}}}, "added_tokens_decoder[\"1998\"]: expected an object"},
      {{{"1998", {{"content", 7}}}}, "with a string \"content\""},
      {{{"x1", token}}, "added_tokens_decoder[\"x1\"]: the key must be a token id"},
      {{{"-3", token}}, "added_tokens_decoder[\"-3\"]: the key must be a token id"},
      {{{"99999999999", token}}, "the key must be a token id"},
      {{{"1998", {{"content", "<x>"}, {"lstrip", "no"}}}},
       "added_tokens_decoder[\"1998\"].lstrip: expected a boolean"},
  };
  for (const auto& [decoder, want] : cases) {
    json c = good;
    c["added_tokens_decoder"] = decoder;
    dir.write("tokenizer_config.json", c.dump());
    const std::string msg = load_error(dir.path());
    EXPECT_NE(msg.find(want), std::string::npos) << decoder.dump() << " -> " << msg;
    EXPECT_NE(msg.find((dir.path() / "tokenizer_config.json").string()), std::string::npos) << msg;
  }
}

// A vocabulary id of 2e9 sized the decoder tables by it: std::bad_alloc (an internal error).
TEST(HfTokenizer, AbsurdIdIsRefusedBeforeAllocating) {
  TempDir dir;
  json j = tiny_json();
  j["model"]["vocab"]["zzz"] = 2000000000;
  dir.write("tokenizer.json", j.dump());
  const std::string msg = load_error(dir.path());
  EXPECT_NE(msg.find("vocab[\"zzz\"]: id 2000000000 is out of range"), std::string::npos) << msg;
  EXPECT_NE(msg.find((dir.path() / "tokenizer.json").string()), std::string::npos) << msg;
  j["model"]["vocab"]["zzz"] = 18446744073709551615ull;
  dir.write("tokenizer.json", j.dump());
  EXPECT_NE(load_error(dir.path()).find("id 18446744073709551615 is out of range"),
            std::string::npos);
}

// Two tokens sharing an id make decoding ambiguous: refused, naming both (escaped).
TEST(HfTokenizer, SharedVocabularyIdsAreRefused) {
  TempDir dir;
  for (const auto& [a, b] : {std::pair{"zzz", "yyy"}, {"q", "\u0001"}}) {
    json j = tiny_json();
    j["model"]["vocab"][a] = 7;
    j["model"]["vocab"][b] = 7;
    dir.write("tokenizer.json", j.dump());
    const std::string msg = load_error(dir.path());
    EXPECT_NE(msg.find("model.vocab: "), std::string::npos) << msg;
    EXPECT_NE(msg.find(" share id 7; the tokenizer.json is likely corrupt"), std::string::npos)
        << msg;
  }
}

// An added token whose recorded id is not the one the tokenizers library gives it: the same
// assignment (the next id after the vocabulary), and the same warning as that library.
TEST(HfTokenizer, AddedTokenIdsThatDifferFromTheFileAreSaid) {
  TempDir dir;
  for (const int64_t id : {5000, 2100}) {
    json j = tiny_json();
    j["added_tokens"].push_back({{"id", id},
                                 {"content", "<zz>"},
                                 {"single_word", false},
                                 {"lstrip", false},
                                 {"rstrip", false},
                                 {"normalized", false},
                                 {"special", true}});
    dir.write("tokenizer.json", j.dump());
    ::testing::internal::CaptureStdout();
    const HfTokenizer tok = HfTokenizer::load(dir.path().string());
    const std::string out = ::testing::internal::GetCapturedStdout();
    const std::vector<int32_t> ids = tok.encode("<zz>", false, false);
    ASSERT_EQ(ids.size(), 1u);
    EXPECT_NE(out.find("added token '<zz>' was expected to have id " + std::to_string(id) +
                       " but was given id " + std::to_string(ids[0])),
              std::string::npos)
        << out;
  }
}

TEST(HfTokenizer, MissingFileNamesThePath) {
  const fs::path missing = fs::temp_directory_path() / "titan_no_such_tokenizer_dir";
  const std::string msg = load_error(missing);
  EXPECT_NE(msg.find(missing.string()), std::string::npos) << msg;
  EXPECT_THROW(HfTokenizer::load((missing / "tokenizer.json").string()), Error);
}

TEST(HfTokenizer, LongInputs) {
  const HfTokenizer& qwen = tokenizer("tokenizers/qwen3");
  // One huge pre-token each: the heap merge path, PCRE2's JIT stack and backtracking.
  for (const std::string& s : {std::string(1 << 18, ' '), std::string(1 << 16, 'a'),
                               std::string(1 << 16, '\n') + "x", std::string(50000, '!')}) {
    const std::vector<int32_t> ids = qwen.encode(s, false, false);
    EXPECT_LT(ids.size(), s.size());
    EXPECT_EQ(qwen.decode(ids), s);
  }
}

}  // namespace
}  // namespace titan::data
