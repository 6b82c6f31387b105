// Byte-level BPE model of the Hugging Face tokenizer: GPT-2's byte alphabet, the merge table,
// the per-thread word cache and the scratch of one encode call (merging is in hf_bpe.cpp).
#pragma once
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "titan/data/hf_utf8.h"

namespace titan::data::detail {

// Byte-level alphabet (GPT-2's bytes_to_unicode).
struct ByteLevelAlphabet {
  std::array<uint32_t, 256> byte_to_cp{};
  std::unordered_map<uint32_t, uint8_t> cp_to_byte;
  ByteLevelAlphabet() {
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      byte_to_cp[b] = printable ? static_cast<uint32_t>(b) : static_cast<uint32_t>(256 + n++);
      cp_to_byte[byte_to_cp[b]] = static_cast<uint8_t>(b);
    }
  }
  // The raw bytes a byte-level token string stands for; false if it holds other characters.
  bool to_bytes(std::string_view token, std::string* bytes) const {
    bytes->clear();
    for (uint32_t cp : code_points(token)) {
      auto it = cp_to_byte.find(cp);
      if (it == cp_to_byte.end()) return false;
      bytes->push_back(static_cast<char>(it->second));
    }
    return true;
  }
};

const ByteLevelAlphabet& byte_level();

// BPE merges: (left id, right id) -> (rank, merged id), open addressing.
class MergeTable {
 public:
  struct Slot {
    uint64_t key = kEmpty;
    int32_t rank = 0;
    int32_t id = 0;
  };
  void reserve(size_t n) {
    int bits = 4;
    while ((size_t{1} << bits) < n + n / 2 + 16) ++bits;  // load <= 2/3
    shift_ = 64 - bits;
    slots_.assign(size_t{1} << bits, Slot{});
  }
  // Later entries for the same pair replace earlier ones (as a Rust HashMap collect).
  void insert(int32_t a, int32_t b, int32_t rank, int32_t id) {
    const uint64_t k = key(a, b);
    size_t i = index(k);
    const size_t mask = slots_.size() - 1;
    while (slots_[i].key != kEmpty && slots_[i].key != k) i = (i + 1) & mask;
    slots_[i] = Slot{k, rank, id};
  }
  const Slot* find(int32_t a, int32_t b) const {
    const uint64_t k = key(a, b);
    size_t i = index(k);
    const size_t mask = slots_.size() - 1;
    while (true) {
      const Slot& s = slots_[i];
      if (s.key == k) return &s;
      if (s.key == kEmpty) return nullptr;
      i = (i + 1) & mask;
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  static uint64_t key(int32_t a, int32_t b) {
    return (uint64_t{static_cast<uint32_t>(a)} << 32) | static_cast<uint32_t>(b);
  }
  size_t index(uint64_t k) const {
    return static_cast<size_t>((k * 0x9E3779B97F4A7C15ull) >> shift_);
  }
  std::vector<Slot> slots_;
  int shift_ = 60;
};

// BPE word cache (hf_bpe.cpp): per thread, 2 MiB, one 64-byte line per word.
class WordCache;

// This thread's cache for the tokenizer with the given (never reused) instance id; a thread
// keeps caches for its 4 most recently used tokenizers.
WordCache& thread_word_cache(uint64_t owner);

// Source of the tokenizer instance ids (never reused) that key the per-thread word caches.
extern std::atomic<uint64_t> g_next_instance;

// Scratch for one encode call.
struct Work {
  std::vector<int32_t>* out = nullptr;
  WordCache* cache = nullptr;
  std::string nfc_buf, word_buf;
  std::vector<int32_t> sym, rank, merged;
  struct Node {
    int32_t id, prev, next;
    bool alive;
  };
  std::vector<Node> nodes;
  struct HeapItem {
    int32_t rank, pos, id;
  };
  std::vector<HeapItem> heap;
};

}  // namespace titan::data::detail
