// HfTokenizer (hf_tokenizer.h): loading tokenizer.json and tokenizer_config.json into Impl, the
// decoder tables, and the public encode/decode entry points.
#include "titan/data/hf_tokenizer.h"

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "titan/core/error.h"
#include "titan/core/file_io.h"
#include "titan/core/log.h"
#include "titan/data/hf_added_tokens.h"
#include "titan/data/hf_bpe.h"
#include "titan/data/hf_regex.h"
#include "titan/data/hf_tokenizer_impl.h"
#include "titan/data/hf_utf8.h"

namespace titan::data {

using namespace detail;

namespace {
namespace fs = std::filesystem;
// Token ids must be below this (2^24): the id-indexed decoder tables stay under a gigabyte.
constexpr uint64_t kMaxTokenIds = uint64_t{1} << 24;
using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

// GPT-2's pre-tokenizer regex, used by ByteLevel with use_regex.
constexpr const char* kByteLevelPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// ---------------------------------------------------------------------------------------------
// JSON helpers

std::string read_file(const fs::path& p) {
  io::check_input_file(p.string(), "tokenizer file");
  std::ifstream f(p, std::ios::binary);
  if (!f) throw Error("cannot read tokenizer file " + p.string());
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// j[key], or null when absent (without copying).
const json& member(const json& j, const char* key) {
  static const json null_json;
  if (!j.is_object()) return null_json;
  auto it = j.find(key);
  return it == j.end() ? null_json : *it;
}

std::string type_of(const json& j) {
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) return "";
  return j["type"].get<std::string>();
}

bool get_bool(const json& j, const char* key, bool def, const std::string& where) {
  if (!j.is_object() || !j.contains(key) || j[key].is_null()) return def;
  if (!j[key].is_boolean()) throw Error(where + "." + key + ": expected true or false");
  return j[key].get<bool>();
}

}  // namespace

// ---- loading --------------------------------------------------------------------------------

void HfTokenizer::Impl::load_model(const json& m, const std::string& file) {
  const std::string where = file + ": model";
  if (!m.is_object()) throw Error(where + ": missing; expected a BPE model");
  const std::string type = type_of(m);
  if (type != "BPE" && !(type.empty() && m.contains("merges"))) {
    throw Error(where + ".type: \"" + type +
                "\" is not supported; only byte-level BPE tokenizers (model.type \"BPE\") are");
  }
  if (m.contains("dropout") && !m["dropout"].is_null() && m["dropout"].get<double>() != 0.0)
    throw Error(where + ".dropout: BPE dropout is not supported; set it to null");
  if (get_bool(m, "byte_fallback", false, where))
    throw Error(where + ".byte_fallback: true is not supported (byte-level BPE needs none)");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (m.contains(key) && m[key].is_string() && !m[key].get<std::string>().empty())
      throw Error(where + "." + key + ": a non-empty value is not supported");
  }
  ignore_merges = get_bool(m, "ignore_merges", false, where);
  fuse_unk = get_bool(m, "fuse_unk", false, where);
  if (!m.contains("vocab") || !m["vocab"].is_object())
    throw Error(where + ".vocab: missing; expected an object of token -> id");
  vocab.reserve(m["vocab"].size());
  for (const auto& [tok, idj] : m["vocab"].items()) {
    if (!idj.is_number_integer() || (!idj.is_number_unsigned() && idj.get<int64_t>() < 0))
      throw Error(where + ".vocab[\"" + tok + "\"]: expected a non-negative integer id");
    // The decoder keeps a table indexed by id: an absurd id would allocate gigabytes.
    if (idj.is_number_unsigned() ? idj.get<uint64_t>() >= kMaxTokenIds
                                 : idj.get<int64_t>() >= static_cast<int64_t>(kMaxTokenIds))
      throw Error(where + ".vocab[\"" + tok + "\"]: id " + idj.dump() +
                  " is out of range (titan supports ids below " + std::to_string(kMaxTokenIds) +
                  "; released vocabularies have under 300,000); the tokenizer.json is likely "
                  "corrupt");
    vocab.emplace(tok, static_cast<int32_t>(idj.get<int64_t>()));
  }
  model_vocab_len = vocab.size();
  {  // one token per id: two tokens sharing an id make decoding ambiguous
    std::map<int32_t, std::string> by_id;
    for (const auto& [t, id] : vocab)
      if (auto [at, fresh] = by_id.emplace(id, t); !fresh)
        throw Error(where + ".vocab: " + nlohmann::json(at->second).dump() + " and " +
                    nlohmann::json(t).dump() + " share id " + std::to_string(id) +
                    "; the tokenizer.json is likely corrupt");
  }
  if (m.contains("unk_token") && m["unk_token"].is_string()) {
    auto it = vocab.find(m["unk_token"].get<std::string>());
    if (it == vocab.end()) throw Error(where + ".unk_token: not in model.vocab");
    unk_id = it->second;
  }
  const ByteLevelAlphabet& bl = byte_level();
  for (int b = 0; b < 256; ++b) {
    std::string s;
    append_utf8(&s, bl.byte_to_cp[b]);
    auto it = vocab.find(s);
    byte_id[b] = it == vocab.end() ? -1 : it->second;
  }
  if (ignore_merges) {
    std::string bytes;
    for (const auto& [tok, id] : vocab)
      if (bl.to_bytes(tok, &bytes)) vocab_bytes.emplace(bytes, id);
  }
  if (!m.contains("merges") || !m["merges"].is_array())
    throw Error(where + ".merges: missing; expected a list of merges");
  const json& mj = m["merges"];
  merges.reserve(mj.size());
  std::string a, b;
  for (size_t r = 0; r < mj.size(); ++r) {
    const json& e = mj[r];
    const std::string at = where + ".merges[" + std::to_string(r) + "]";
    if (e.is_string()) {
      const std::string& s = e.get_ref<const std::string&>();
      size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
        throw Error(at + ": expected \"left right\"");
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      a = e[0].get<std::string>();
      b = e[1].get<std::string>();
    } else {
      throw Error(at + ": expected \"left right\" or [left, right]");
    }
    auto ia = vocab.find(a), ib = vocab.find(b), iab = vocab.find(a + b);
    if (ia == vocab.end() || ib == vocab.end() || iab == vocab.end())
      throw Error(at + ": \"" + a + "\", \"" + b + "\" or their merge is not in model.vocab");
    merges.insert(ia->second, ib->second, static_cast<int32_t>(r), iab->second);
  }
}

void HfTokenizer::Impl::load_normalizer(const json& n, const std::string& where) {
  if (n.is_null()) return;
  const std::string type = type_of(n);
  if (type == "NFC") {
    nfc = true;
  } else if (type == "Sequence" && n.contains("normalizers") && n["normalizers"].is_array()) {
    for (size_t i = 0; i < n["normalizers"].size(); ++i)
      load_normalizer(n["normalizers"][i], where + ".normalizers[" + std::to_string(i) + "]");
  } else {
    throw Error(where + ".type: \"" + type +
                "\" is not supported (supported normalizers: null, NFC, Sequence of NFC)");
  }
}

void HfTokenizer::Impl::load_pre_tokenizer(const json& p, const std::string& where,
                                           std::vector<std::string>* steps) {
  const std::string type = type_of(p);
  if (type == "Sequence" && p.contains("pretokenizers") && p["pretokenizers"].is_array()) {
    for (size_t i = 0; i < p["pretokenizers"].size(); ++i)
      load_pre_tokenizer(p["pretokenizers"][i], where + ".pretokenizers[" + std::to_string(i) + "]",
                         steps);
    return;
  }
  if (type != "Split" && type != "ByteLevel") {
    throw Error(where + ".type: " + (p.is_null() ? std::string("null") : "\"" + type + "\"") +
                " is not supported (supported: ByteLevel, or a Sequence of Split steps ending "
                "in ByteLevel)");
  }
  if (!steps->empty() && steps->back() == "ByteLevel")
    throw Error(where + ": a step after ByteLevel is not supported");
  if (type == "Split") {
    const std::string behavior = p.value("behavior", std::string());
    if (behavior != "Isolated")
      throw Error(where + ".behavior: \"" + behavior + "\" is not supported (only Isolated)");
    if (get_bool(p, "invert", false, where)) throw Error(where + ".invert: true is not supported");
    SplitStep st;
    const json& pat = member(p, "pattern");
    if (pat.is_object() && pat.contains("Regex") && pat["Regex"].is_string()) {
      st.re = Regex(onig_to_pcre2(pat["Regex"].get<std::string>(), where + ".pattern.Regex"),
                    where + ".pattern.Regex");
    } else if (pat.is_object() && pat.contains("String") && pat["String"].is_string() &&
               !pat["String"].get<std::string>().empty()) {
      st.literal = pat["String"].get<std::string>();
    } else {
      throw Error(where + ".pattern: expected {\"Regex\": ...} or a non-empty {\"String\": ...}");
    }
    splits.push_back(std::move(st));
  } else {
    prefix_space = get_bool(p, "add_prefix_space", true, where);
    if (get_bool(p, "use_regex", true, where))
      byte_level_re = Regex(onig_to_pcre2(kByteLevelPattern, where), where);
  }
  steps->push_back(type);
}

void HfTokenizer::Impl::load_post_processor(const json& p, const std::string& where) {
  if (p.is_null()) return;
  const std::string type = type_of(p);
  if (type == "ByteLevel") return;  // offsets only
  if (type == "Sequence" && p.contains("processors") && p["processors"].is_array()) {
    for (size_t i = 0; i < p["processors"].size(); ++i)
      load_post_processor(p["processors"][i], where + ".processors[" + std::to_string(i) + "]");
    return;
  }
  if (type != "TemplateProcessing") {
    throw Error(where + ".type: \"" + type +
                "\" is not supported (supported: null, ByteLevel, TemplateProcessing, Sequence)");
  }
  if (!p.contains("single") || !p["single"].is_array())
    throw Error(where + ".single: expected a list of template pieces");
  const json& specials = member(p, "special_tokens");
  bool seen_a = false;
  for (const json& piece : p["single"]) {
    if (piece.contains("Sequence")) {
      if (piece["Sequence"].value("id", std::string()) != "A" || seen_a)
        throw Error(where + ".single: only one sequence $A is supported");
      seen_a = true;
    } else if (piece.contains("SpecialToken")) {
      const std::string name = piece["SpecialToken"].value("id", std::string());
      if (!specials.is_object() || !specials.contains(name) || !specials[name].contains("ids") ||
          !specials[name]["ids"].is_array())
        throw Error(where + ".special_tokens: no ids for \"" + name + "\"");
      for (const json& id : specials[name]["ids"])
        (seen_a ? template_suffix : template_prefix).push_back(id.get<int32_t>());
    } else {
      throw Error(where + ".single: unknown template piece " + piece.dump());
    }
  }
  if (!seen_a) throw Error(where + ".single: the template has no sequence $A");
}

// tokenizers' AddedVocabulary::add_tokens: an already registered token equal in every flag is
// ignored; otherwise it takes the id of the same string (added or model vocabulary) or the next
// free id, and its flags replace the old ones. Special tokens stay special.
void HfTokenizer::Impl::add_tokens(const std::vector<AddedToken>& tokens) {
  for (const AddedToken& t : tokens)
    if (t.special && !t.content.empty()) special_set.insert(t.content);
  for (const AddedToken& t : tokens) {
    if (t.content.empty()) continue;
    auto known = find_id(t.content);
    if (auto a = added_map.find(t.content); a != added_map.end() && added_r.at(a->second) == t)
      continue;
    int32_t id;
    if (known) {
      id = *known;
    } else if (added_max < 0) {
      id = static_cast<int32_t>(model_vocab_len);
    } else {
      id = (added_max >= static_cast<int32_t>(model_vocab_len) || model_vocab_len == 0)
               ? added_max + 1
               : static_cast<int32_t>(model_vocab_len);
    }
    added_map[t.content] = id;
    added_r[id] = t;
    added_max = std::max(added_max, id);
  }
}

void HfTokenizer::Impl::refresh_added() {
  std::vector<LiteralSet::Entry> raw, norm;
  for (const auto& [content, id] : added_map) {
    const AddedToken& t = added_r.at(id);
    if (t.content != content) continue;  // superseded mapping
    if (t.normalized) {
      norm.push_back({nfc ? nfc_string(content) : content, id, t});
    } else {
      raw.push_back({content, id, t});
    }
  }
  raw_set.build(std::move(raw));
  normalized_set.build(std::move(norm));
}

// torchtitan's HuggingFaceTokenizer._infer_special_tokens: the standard token keys and
// added_tokens_decoder of tokenizer_config.json are registered as special added tokens (so
// decode skips them, e.g. Qwen3's <think>); BOS and EOS are the ids of bos_token and eos_token.
void HfTokenizer::Impl::apply_tokenizer_config(const fs::path& config_path) {
  if (!fs::exists(config_path)) return;
  const std::string file = config_path.string();
  ojson c;
  try {
    c = ojson::parse(read_file(config_path));
  } catch (const ojson::exception& e) {
    throw Error(file + ": invalid JSON (" + e.what() + ")");
  }
  if (!c.is_object()) throw Error(file + ": expected a JSON object");
  auto token_of = [&](const char* key) -> std::optional<std::string> {
    if (!c.contains(key) || c[key].is_null()) return std::nullopt;
    const ojson& v = c[key];
    if (v.is_string()) return v.get<std::string>();
    if (v.is_object() && v.contains("content") && v["content"].is_string())
      return v["content"].get<std::string>();
    throw Error(file + ": " + key + ": expected a string, {\"content\": ...} or null");
  };
  auto flags_of = [&](const ojson& v, const std::string& content, const std::string& where) {
    AddedToken t;
    t.content = content;
    auto flag = [&](const char* k, bool def) {
      if (!v.contains(k) || v[k].is_null()) return def;
      if (!v[k].is_boolean()) throw Error(file + ": " + where + "." + k + ": expected a boolean");
      return v[k].get<bool>();
    };
    t.single_word = flag("single_word", false);
    t.lstrip = flag("lstrip", false);
    t.rstrip = flag("rstrip", false);
    t.normalized = flag("normalized", true);
    t.special = true;  // torchtitan registers them with add_special_tokens, which forces this
    return t;
  };
  std::vector<AddedToken> tokens;
  for (const char* key : {"bos_token", "eos_token", "pad_token", "unk_token", "sep_token",
                          "cls_token", "mask_token"}) {
    std::optional<std::string> s = token_of(key);
    if (!s) continue;
    if (c[key].is_object()) {
      tokens.push_back(flags_of(c[key], *s, key));
    } else {
      AddedToken t;
      t.content = *s;
      t.special = true;
      t.normalized = false;
      tokens.push_back(t);
    }
  }
  if (c.contains("added_tokens_decoder")) {
    const ojson& d = c["added_tokens_decoder"];
    if (!d.is_object()) throw Error(file + ": added_tokens_decoder: expected an object");
    // Transformers refuses these too (int(id) and AddedToken(**entry) raise).
    for (const auto& [id, v] : d.items()) {
      const std::string where = "added_tokens_decoder[\"" + id + "\"]";
      const bool id_ok =
          !id.empty() && id.size() <= 9 && id.find_first_not_of("0123456789") == std::string::npos;
      if (!id_ok)
        throw Error(file + ": " + where + ": the key must be a token id (a non-negative integer)");
      if (!v.is_object() || !v.contains("content") || !v["content"].is_string())
        throw Error(file + ": " + where +
                    ": expected an object with a string \"content\" (the token's text)");
      tokens.push_back(flags_of(v, v["content"].get<std::string>(), where));
    }
  }
  add_tokens(tokens);
  if (auto b = token_of("bos_token")) bos = find_id(*b);
  if (auto e = token_of("eos_token")) eos = find_id(*e);
}

void HfTokenizer::Impl::build_decoder() {
  int64_t mx = -1;
  for (const auto& [t, id] : vocab) mx = std::max<int64_t>(mx, id);
  for (const auto& [t, id] : added_map) mx = std::max<int64_t>(mx, id);
  vocab_size = mx + 1;
  id_bytes.assign(static_cast<size_t>(vocab_size), std::string());
  id_kind.assign(static_cast<size_t>(vocab_size), 0);
  const ByteLevelAlphabet& bl = byte_level();
  std::string bytes;
  auto set = [&](int32_t id, const std::string& tok, uint8_t kind) {
    id_bytes[static_cast<size_t>(id)] = bl.to_bytes(tok, &bytes) ? bytes : tok;
    id_kind[static_cast<size_t>(id)] = kind;
  };
  for (const auto& [t, id] : vocab) set(id, t, 1);
  for (const auto& [id, t] : added_r)
    if (added_map.count(t.content) && added_map.at(t.content) == id)
      set(id, t.content, special_set.count(t.content) ? 2 : 1);
}

// ---- public ---------------------------------------------------------------------------------

HfTokenizer::HfTokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HfTokenizer::HfTokenizer(HfTokenizer&&) noexcept = default;
HfTokenizer& HfTokenizer::operator=(HfTokenizer&&) noexcept = default;
HfTokenizer::~HfTokenizer() = default;

HfTokenizer HfTokenizer::load(const std::string& dir_or_file) {
  fs::path file = dir_or_file;
  std::error_code ec;
  if (fs::is_directory(file, ec)) file /= "tokenizer.json";
  if (!fs::is_regular_file(file, ec)) {
    throw Error("tokenizer file not found: " + file.string() +
                " (pass a directory holding tokenizer.json, or the file itself)");
  }
  auto impl = std::make_unique<Impl>();
  impl->path = file.string();
  const std::string& where = impl->path;
  json j;
  try {
    j = json::parse(read_file(file));
  } catch (const json::exception& e) {
    throw Error(where + ": invalid JSON (" + e.what() + ")");
  }
  if (!j.is_object()) throw Error(where + ": expected a JSON object");
  try {
    impl->load_model(member(j, "model"), where);
    impl->load_normalizer(member(j, "normalizer"), where + ": normalizer");
    std::vector<std::string> steps;
    impl->load_pre_tokenizer(member(j, "pre_tokenizer"), where + ": pre_tokenizer", &steps);
    if (steps.empty() || steps.back() != "ByteLevel")
      throw Error(where + ": pre_tokenizer: must end with a ByteLevel step (byte-level BPE)");
    const json& dec = member(j, "decoder");
    if (type_of(dec) != "ByteLevel") {
      throw Error(where + ": decoder.type: " +
                  (dec.is_null() ? std::string("null") : "\"" + type_of(dec) + "\"") +
                  " is not supported (only ByteLevel)");
    }
    impl->load_post_processor(member(j, "post_processor"), where + ": post_processor");
    std::vector<AddedToken> added;
    std::vector<std::optional<int64_t>> file_ids;  // each added token's "id" in the file
    if (j.contains("added_tokens") && !j["added_tokens"].is_null()) {
      if (!j["added_tokens"].is_array()) throw Error(where + ": added_tokens: expected a list");
      for (size_t i = 0; i < j["added_tokens"].size(); ++i) {
        const json& e = j["added_tokens"][i];
        const std::string at = where + ": added_tokens[" + std::to_string(i) + "]";
        if (!e.is_object() || !e.contains("content") || !e["content"].is_string())
          throw Error(at + ".content: expected a string");
        AddedToken t;
        t.content = e["content"].get<std::string>();
        t.single_word = get_bool(e, "single_word", false, at);
        t.lstrip = get_bool(e, "lstrip", false, at);
        t.rstrip = get_bool(e, "rstrip", false, at);
        t.normalized = get_bool(e, "normalized", true, at);
        t.special = get_bool(e, "special", false, at);
        if (e.contains("id") && !e["id"].is_null() && !e["id"].is_number_integer())
          throw Error(at + ".id: expected an integer");
        file_ids.push_back(e.contains("id") && e["id"].is_number_integer()
                               ? std::optional<int64_t>(e["id"].get<int64_t>())
                               : std::nullopt);
        added.push_back(std::move(t));
      }
    }
    impl->add_tokens(added);
    // Ids are assigned as the tokenizers library assigns them (the vocabulary's id, else the
    // next one after it); like that library, say so when the file recorded another one.
    for (size_t i = 0; i < added.size(); ++i)
      if (auto got = impl->find_id(added[i].content); got && file_ids[i] && *file_ids[i] != *got)
        log::warn(where + ": added token '" + added[i].content + "' was expected to have id " +
                  std::to_string(*file_ids[i]) + " but was given id " + std::to_string(*got) +
                  " (the tokenizers library assigns it the same way)");
  } catch (const json::exception& e) {
    throw Error(where + ": unexpected JSON content (" + e.what() + ")");
  }
  impl->apply_tokenizer_config(file.parent_path() / "tokenizer_config.json");
  impl->refresh_added();
  impl->build_decoder();
  auto in_template = [&](std::optional<int32_t> id) {
    if (!id) return false;
    const auto& a = impl->template_prefix;
    const auto& b = impl->template_suffix;
    return std::find(a.begin(), a.end(), *id) != a.end() ||
           std::find(b.begin(), b.end(), *id) != b.end();
  };
  impl->adds_bos = in_template(impl->bos);
  impl->adds_eos = in_template(impl->eos);
  return HfTokenizer(std::move(impl));
}

void HfTokenizer::encode_into(std::string_view text, bool add_bos, bool add_eos,
                              std::vector<int32_t>* out) const {
  const Impl& m = *impl_;
  std::string clean;
  if (!is_valid_utf8(text)) {
    clean = sanitize_utf8(text, nullptr);
    text = clean;
  }
  if (add_bos && m.bos && !m.adds_bos) out->push_back(*m.bos);
  out->insert(out->end(), m.template_prefix.begin(), m.template_prefix.end());
  Work w;
  w.out = out;
  w.cache = &thread_word_cache(m.instance);
  m.encode_text(text, w);
  out->insert(out->end(), m.template_suffix.begin(), m.template_suffix.end());
  if (add_eos && m.eos && !m.adds_eos) out->push_back(*m.eos);
}

std::vector<int32_t> HfTokenizer::encode(std::string_view text, bool add_bos, bool add_eos) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  encode_into(text, add_bos, add_eos, &ids);
  return ids;
}

std::string HfTokenizer::decode(const std::vector<int32_t>& ids) const {
  const Impl& m = *impl_;
  std::string bytes;
  for (int32_t id : ids) {
    if (id < 0 || id >= m.vocab_size || m.id_kind[static_cast<size_t>(id)] != 1) continue;
    bytes += m.id_bytes[static_cast<size_t>(id)];
  }
  if (is_valid_utf8(bytes)) return bytes;
  return sanitize_utf8(bytes, nullptr);
}

int64_t HfTokenizer::vocab_size() const { return impl_->vocab_size; }
std::optional<int32_t> HfTokenizer::bos_id() const { return impl_->bos; }
std::optional<int32_t> HfTokenizer::eos_id() const { return impl_->eos; }
std::optional<int32_t> HfTokenizer::token_to_id(const std::string& token) const {
  return impl_->find_id(token);
}
const std::string& HfTokenizer::path() const { return impl_->path; }

std::string HfTokenizer::sanitize_utf8(std::string_view s, int64_t* replaced) {
  std::string out;
  out.reserve(s.size());
  int64_t count = 0;
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t i = 0;
  while (i < s.size()) {
    const size_t j = first_non_ascii(s, i);
    out.append(s.data() + i, j - i);
    i = j;
    if (i >= s.size()) break;
    Utf8Step st = utf8_step(p + i, s.size() - i);
    if (st.ok) {
      out.append(s.data() + i, static_cast<size_t>(st.len));
    } else {
      out += "\xEF\xBF\xBD";
      ++count;
    }
    i += static_cast<size_t>(st.len);
  }
  if (replaced) *replaced = count;
  return out;
}

}  // namespace titan::data
