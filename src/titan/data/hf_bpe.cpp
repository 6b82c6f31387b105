// Byte-level BPE: the byte alphabet table, the per-thread word cache, and merging a word's byte
// symbols by rank (linear scans for short words, a heap for long ones) as tokenizers does.
#include "titan/data/hf_bpe.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string_view>
#include <utility>
#include <vector>

#include "titan/data/hf_tokenizer_impl.h"

namespace titan::data {
namespace detail {

const ByteLevelAlphabet& byte_level() {
  static const ByteLevelAlphabet a;
  return a;
}

// BPE word cache: per thread (no locks, no sharing), 2 MiB, 2-way set associative, one 64-byte line
// per word: the word's bytes and its ids inline. Words over 22 bytes or 8 ids are not cached.
class WordCache {
 public:
  static constexpr size_t kMaxBytes = 22, kMaxIds = 8;
  WordCache() : entries_(2 * kSets) {}
  bool find(uint64_t h, std::string_view w, std::vector<int32_t>* out) const {
    const Entry* set = &entries_[2 * (h & (kSets - 1))];
    for (int k = 0; k < 2; ++k) {
      const Entry& e = set[k];
      if (e.hash == h && e.len == w.size() && std::memcmp(e.key, w.data(), w.size()) == 0) {
        out->insert(out->end(), e.ids, e.ids + e.n);
        return true;
      }
    }
    return false;
  }
  void insert(uint64_t h, std::string_view w, const std::vector<int32_t>& ids) {
    Entry* set = &entries_[2 * (h & (kSets - 1))];
    set[1] = set[0];  // the newest entry stays in way 0
    Entry& e = set[0];
    e.hash = h;
    e.len = static_cast<uint8_t>(w.size());
    e.n = static_cast<uint8_t>(ids.size());
    std::memcpy(e.key, w.data(), w.size());
    std::copy(ids.begin(), ids.end(), e.ids);
  }

 private:
  static constexpr size_t kSets = size_t{1} << 14;  // 32768 words, 2 MiB
  struct alignas(64) Entry {
    uint64_t hash = 0;
    uint8_t len = 0, n = 0;
    char key[kMaxBytes];
    int32_t ids[kMaxIds];
  };
  static_assert(sizeof(Entry) == 64);
  std::vector<Entry> entries_;
};

WordCache& thread_word_cache(uint64_t owner) {
  thread_local std::vector<std::pair<uint64_t, std::unique_ptr<WordCache>>> caches;
  for (auto& [o, c] : caches)
    if (o == owner) return *c;
  if (caches.size() >= 4) caches.erase(caches.begin());
  caches.emplace_back(owner, std::make_unique<WordCache>());
  return *caches.back().second;
}

std::atomic<uint64_t> g_next_instance{1};

}  // namespace detail

using namespace detail;

namespace {

// Hash of a word's bytes for the word cache (never 0).
inline uint64_t hash_bytes(std::string_view s) {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ s.size();
  size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    uint64_t v;
    std::memcpy(&v, s.data() + i, 8);
    h = (h ^ v) * 0xBF58476D1CE4E5B9ull;
    h ^= h >> 31;
  }
  if (i < s.size()) {
    uint64_t v = 0;
    std::memcpy(&v, s.data() + i, s.size() - i);
    h = (h ^ v) * 0xBF58476D1CE4E5B9ull;
    h ^= h >> 31;
  }
  h *= 0x94D049BB133111EBull;
  h ^= h >> 32;
  return h | 1;  // 0 marks an empty slot
}

constexpr size_t kSmallWord = 48;  // words up to this many symbols merge by linear scans

}  // namespace

void HfTokenizer::Impl::bpe(std::string_view word, Work& w) const {
  const auto* p = reinterpret_cast<const unsigned char*>(word.data());
  const size_t n = word.size();
  if (n == 1) {
    const int32_t id = byte_id[p[0]];
    if (id >= 0) {
      w.out->push_back(id);
    } else if (unk_id >= 0) {
      w.out->push_back(unk_id);
    }
    return;
  }
  if (ignore_merges) {
    auto it = vocab_bytes.find(std::string(word));
    if (it != vocab_bytes.end()) {
      w.out->push_back(it->second);
      return;
    }
  }
  const bool cacheable = n <= WordCache::kMaxBytes;
  const uint64_t h = cacheable ? hash_bytes(word) : 0;
  if (cacheable && w.cache->find(h, word, w.out)) return;
  // Initial symbols: the bytes' ids; unknown bytes become unk (fused when asked) or vanish.
  w.sym.clear();
  bool pending_unk = false;
  for (size_t i = 0; i < n; ++i) {
    const int32_t id = byte_id[p[i]];
    if (id >= 0) {
      if (pending_unk) w.sym.push_back(unk_id);
      pending_unk = false;
      w.sym.push_back(id);
    } else if (unk_id >= 0) {
      if (pending_unk && !fuse_unk) w.sym.push_back(unk_id);
      pending_unk = true;
    }
  }
  if (pending_unk) w.sym.push_back(unk_id);
  if (w.sym.size() <= kSmallWord) {
    merge_small(w);
  } else {
    merge_heap(w);
  }
  w.out->insert(w.out->end(), w.sym.begin(), w.sym.end());
  if (cacheable && w.sym.size() <= WordCache::kMaxIds) w.cache->insert(h, word, w.sym);
}

// Repeatedly merges the lowest-ranked adjacent pair, leftmost first: the order tokenizers'
// heap-based Word::merge_all applies merges in.
void HfTokenizer::Impl::merge_small(Work& w) const {
  std::vector<int32_t>& s = w.sym;
  size_t n = s.size();
  if (n < 2) return;
  w.rank.resize(n);
  w.merged.resize(n);
  int32_t* rk = w.rank.data();
  int32_t* nid = w.merged.data();
  auto pair_at = [&](size_t i) {
    const MergeTable::Slot* m = merges.find(s[i], s[i + 1]);
    rk[i] = m ? m->rank : INT32_MAX;
    nid[i] = m ? m->id : -1;
  };
  for (size_t i = 0; i + 1 < n; ++i) pair_at(i);
  while (n > 1) {
    size_t best = 0;
    int32_t br = rk[0];
    for (size_t i = 1; i + 1 < n; ++i) {
      if (rk[i] < br) {
        br = rk[i];
        best = i;
      }
    }
    if (br == INT32_MAX) break;
    s[best] = nid[best];
    for (size_t i = best + 1; i + 1 < n; ++i) {
      s[i] = s[i + 1];
      rk[i] = rk[i + 1];
      nid[i] = nid[i + 1];
    }
    --n;
    if (best > 0) pair_at(best - 1);
    if (best + 1 < n) pair_at(best);
  }
  s.resize(n);
}

// tokenizers' Word::merge_all for long words: a min-heap of (rank, position) candidates, stale
// entries skipped when the pair at the position no longer merges into the same token.
void HfTokenizer::Impl::merge_heap(Work& w) const {
  const size_t n = w.sym.size();
  w.nodes.resize(n);
  for (size_t i = 0; i < n; ++i) {
    w.nodes[i] = {w.sym[i], static_cast<int32_t>(i) - 1,
                  i + 1 < n ? static_cast<int32_t>(i + 1) : -1, true};
  }
  auto greater = [](const Work::HeapItem& a, const Work::HeapItem& b) {
    return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
  };
  w.heap.clear();
  auto push = [&](int32_t pos, int32_t left, int32_t right) {
    if (const MergeTable::Slot* m = merges.find(left, right)) {
      w.heap.push_back({m->rank, pos, m->id});
      std::push_heap(w.heap.begin(), w.heap.end(), greater);
    }
  };
  for (size_t i = 0; i + 1 < n; ++i) push(static_cast<int32_t>(i), w.sym[i], w.sym[i + 1]);
  while (!w.heap.empty()) {
    std::pop_heap(w.heap.begin(), w.heap.end(), greater);
    const Work::HeapItem top = w.heap.back();
    w.heap.pop_back();
    Work::Node& cur = w.nodes[static_cast<size_t>(top.pos)];
    if (!cur.alive || cur.next < 0) continue;
    Work::Node& right = w.nodes[static_cast<size_t>(cur.next)];
    const MergeTable::Slot* m = merges.find(cur.id, right.id);
    if (!m || m->id != top.id) continue;
    cur.id = top.id;
    right.alive = false;
    cur.next = right.next;
    if (right.next >= 0) w.nodes[static_cast<size_t>(right.next)].prev = top.pos;
    if (cur.prev >= 0) push(cur.prev, w.nodes[static_cast<size_t>(cur.prev)].id, cur.id);
    if (cur.next >= 0) push(top.pos, cur.id, w.nodes[static_cast<size_t>(cur.next)].id);
  }
  w.sym.clear();
  for (const Work::Node& nd : w.nodes)
    if (nd.alive) w.sym.push_back(nd.id);
}

}  // namespace titan::data
