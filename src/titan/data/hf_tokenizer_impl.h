// HfTokenizer::Impl (hf_tokenizer.h): the loaded model, added tokens, pre-tokenizer pipeline and
// decoder tables; loading is in hf_tokenizer.cpp, encoding in hf_pre_tokenizer.cpp and hf_bpe.cpp.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "titan/data/hf_added_tokens.h"
#include "titan/data/hf_bpe.h"
#include "titan/data/hf_regex.h"
#include "titan/data/hf_tokenizer.h"

namespace titan::data {

struct HfTokenizer::Impl {
  std::string path;
  // Model.
  std::unordered_map<std::string, int32_t> vocab;  // byte-level strings
  size_t model_vocab_len = 0;
  std::array<int32_t, 256> byte_id{};                    // id of each byte's symbol, -1 if none
  std::unordered_map<std::string, int32_t> vocab_bytes;  // raw-byte form (ignore_merges)
  detail::MergeTable merges;
  bool ignore_merges = false;
  int32_t unk_id = -1;
  bool fuse_unk = false;
  // Added tokens (tokenizers' AddedVocabulary).
  std::unordered_map<std::string, int32_t> added_map;
  std::unordered_map<int32_t, detail::AddedToken> added_r;
  std::unordered_set<std::string> special_set;
  int32_t added_max = -1;  // largest id in added_map
  detail::LiteralSet raw_set, normalized_set;
  // Pipeline.
  bool nfc = false;
  struct SplitStep {
    detail::Regex re;
    std::string literal;  // when not a regex
  };
  std::vector<SplitStep> splits;
  bool prefix_space = false;
  detail::Regex byte_level_re;  // valid when ByteLevel use_regex
  std::vector<int32_t> template_prefix, template_suffix;
  // Decoding.
  std::vector<std::string> id_bytes;
  std::vector<uint8_t> id_kind;  // 0: no token, 1: token, 2: special (skipped)
  int64_t vocab_size = 0;
  std::optional<int32_t> bos, eos;
  bool adds_bos = false, adds_eos = false;
  // Keys the per-thread word caches.
  const uint64_t instance = detail::g_next_instance.fetch_add(1);

  // ---- loading ----
  void load_model(const nlohmann::json& m, const std::string& file);
  void load_normalizer(const nlohmann::json& n, const std::string& where);
  void load_pre_tokenizer(const nlohmann::json& p, const std::string& where,
                          std::vector<std::string>* steps);
  void load_post_processor(const nlohmann::json& p, const std::string& where);
  void add_tokens(const std::vector<detail::AddedToken>& tokens);
  void refresh_added();
  void apply_tokenizer_config(const std::filesystem::path& config_path);
  void build_decoder();
  std::optional<int32_t> find_id(const std::string& token) const {
    auto a = added_map.find(token);
    if (a != added_map.end()) return a->second;
    auto v = vocab.find(token);
    if (v != vocab.end()) return v->second;
    return std::nullopt;
  }

  // ---- encoding ----
  void encode_text(std::string_view text, detail::Work& w) const;
  void normalize_piece(std::string_view piece, detail::Work& w) const;
  void pre_tokenize(std::string_view piece, size_t step, detail::Work& w) const;
  void byte_level_piece(std::string_view piece, detail::Work& w) const;
  void bpe(std::string_view word, detail::Work& w) const;
  void merge_small(detail::Work& w) const;
  void merge_heap(detail::Work& w) const;
  template <class F>
  void split_step(const SplitStep& st, std::string_view s, F&& f) const;
  template <class F>
  void split_regex(const detail::Regex& re, std::string_view s, F&& f) const;
};

}  // namespace titan::data
