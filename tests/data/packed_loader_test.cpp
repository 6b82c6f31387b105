// The loader's saved position: restore() continues exactly, and refuses (one titan::Error naming
// the field, the loader unchanged) any state that does not fit this dataset, where reading it
// would index outside the document order or feed ids past the vocabulary.
#include "titan/data/packed_loader.h"

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "test_util.h"
#include "titan/core/error.h"

namespace titan::data {
namespace {

using nlohmann::json;
using titan::testing::error_of;

std::vector<std::string> docs() {
  std::vector<std::string> d;
  for (int i = 0; i < 12; ++i) d.push_back("doc " + std::to_string(i) + std::string(i % 5, 'x'));
  return d;
}

LoaderOptions opts() {
  LoaderOptions o;
  o.batch = 2;
  o.seq_len = 8;
  o.seed = 7;
  return o;
}

std::vector<int32_t> next_batch(PackedLoader& l) {
  std::vector<int32_t> in(16), lab(16), pos(16);
  l.next(in.data(), lab.data(), pos.data());
  in.insert(in.end(), lab.begin(), lab.end());
  in.insert(in.end(), pos.begin(), pos.end());
  return in;
}

TEST(PackedLoader, RestoreContinuesExactly) {
  ByteTokenizer tok;
  PackedLoader a(docs(), tok, opts());
  for (int i = 0; i < 9; ++i) next_batch(a);  // into the second epoch (shuffled)
  ASSERT_GE(a.epoch(), 1);
  PackedLoader b(docs(), tok, opts());
  b.restore(a.state());
  for (int i = 0; i < 6; ++i) EXPECT_EQ(next_batch(a), next_batch(b)) << i;
}

TEST(PackedLoader, RestoreRejectsStatesOutsideTheDataset) {
  ByteTokenizer tok;
  PackedLoader a(docs(), tok, opts());
  for (int i = 0; i < 9; ++i) next_batch(a);
  const json good = a.state();
  ASSERT_GT(good["input"].size(), 2u);
  const std::vector<std::pair<std::function<void(json&)>, std::string>> cases = {
      {[](json& s) { s["cursor"] = 1000000; }, "\"cursor\" 1000000 is outside [0, 12]"},
      {[](json& s) { s["cursor"] = -3; }, "\"cursor\" -3"},
      {[](json& s) { s["cursor"] = "3"; }, "\"cursor\" must be an integer"},
      {[](json& s) { s["cursor"] = 1e30; }, "\"cursor\" must be an integer"},
      {[](json& s) { s["cursor"] = 18446744073709551615ull; }, "\"cursor\" must be an integer"},
      {[](json& s) { s["order"].erase(s["order"].size() - 1); }, "\"order\" lists 11 documents"},
      {[](json& s) { s["order"] = json::array(); }, "\"order\" lists 0 documents"},
      {[](json& s) { s["order"][3] = 99999; }, "\"order\"[3] is 99999, outside [0, 12)"},
      {[](json& s) { s["order"][0] = -1; }, "\"order\"[0] is -1"},
      {[](json& s) { s["order"][1] = s["order"][0]; }, "not a permutation"},
      {[](json& s) { s["order"] = "0,1,2"; }, "\"order\" must be an array"},
      {[](json& s) { s["input"][0] = 100000; }, "\"input\"[0] is 100000"},
      {[](json& s) { s["labels"][1] = -7; }, "\"labels\"[1] is -7"},
      {[](json& s) { s["positions"][0] = 8; }, "\"positions\"[0] is 8, outside [0, 8)"},
      {[](json& s) {
         s["positions"][0] = 0;
         s["positions"][1] = 5;
       },
       "\"positions\"[1] is 5 after 0"},
      {[](json& s) { s["input"].erase(0); }, "differ in length"},
      {[](json& s) { s.erase("epoch"); }, "lacks \"epoch\""},
      {[](json& s) { s["epoch"] = -1; }, "\"epoch\" is negative"},
      {[](json& s) { s["version"] = 2; }, "unknown \"version\""},
      {[](json& s) { s["version"] = "1"; }, "\"version\" must be an integer"},
      {[](json& s) { s["documents"] = 11; }, "dataset of 11 documents, this one has 12"},
      {[](json& s) { s["seq_len"] = 16; }, "training.seq_len 16, this run has 8"},
      {[](json& s) { s["dp_world"] = 2; }, "rank 0 of 2"},
      {[](json& s) { s = json::array(); }, "must be a JSON object"},
  };
  for (const auto& [mutate, needle] : cases) {
    PackedLoader b(docs(), tok, opts());
    PackedLoader fresh(docs(), tok, opts());
    json s = good;
    mutate(s);
    const std::string err = error_of([&] { b.restore(s); });
    EXPECT_NE(err.find(needle), std::string::npos) << "want '" << needle << "' in: " << err;
    EXPECT_EQ(err.find('\n'), std::string::npos) << err;
    EXPECT_EQ(next_batch(b), next_batch(fresh)) << "a refused state changed the loader";
  }
}

}  // namespace
}  // namespace titan::data
