// Chat records -> rendered, tokenized conversations with per-token trained flags
// (chat_dataset.h).
#include "titan/data/chat_dataset.h"

#include <algorithm>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "nlohmann/json.hpp"
#include "titan/core/error.h"
#include "titan/core/file_io.h"
#include "titan/core/log.h"
#include "titan/data/chat_template.h"

namespace titan::data {
namespace {

using nlohmann::json;

// A record's text, cut where the trained flag changes; eos: the tokenizer's EOS follows, trained.
struct Conversation {
  std::vector<ChatSegment> segments;
  bool eos = false;
};

bool has_assistant(const std::vector<ChatMessage>& m, size_t from) {
  for (size_t i = from; i < m.size(); ++i)
    if (m[i].role == "assistant") return true;
  return false;
}

const char* kShapes =
    "a chat record is {\"messages\": [{\"role\": ..., \"content\": ...}, ...]} or "
    "{\"prompt\": ..., \"completion\": ...}";

// One record as a conversation; titan::Error naming `at` when it is malformed.
Conversation parse_record(const json& j, const std::string& at, bool train_on_prompt) {
  check(j.is_object(), at + ": the record is not a JSON object; " + kShapes);
  const bool pc = j.contains("prompt") && j.contains("completion");
  check(j.contains("messages") || pc,
        at + ": no \"messages\" (nor \"prompt\" and \"completion\"); " + kShapes);
  const std::string untrainable = "; set sft.train_on_prompt to train on every token";
  Conversation c;
  if (j.contains("messages")) {
    const std::vector<ChatMessage> m = chat_messages(j["messages"], at);
    check(train_on_prompt || has_assistant(m, 0),
          at + ": no assistant turn, nothing to train on" + untrainable);
    c.segments = qwen3_chat_segments(m);
    return c;
  }
  const json &p = j["prompt"], &q = j["completion"];
  if (p.is_string() && q.is_string()) {
    for (const auto& [text, trained] :
         {std::pair{p.get<std::string>(), false}, std::pair{q.get<std::string>(), true}})
      if (!text.empty()) c.segments.push_back({text, trained});
    c.eos = true;
    return c;
  }
  check(p.is_array() && q.is_array(),
        at + ": \"prompt\" and \"completion\" must be both strings or both message lists");
  std::vector<ChatMessage> m = chat_messages(p, at + ": prompt");
  const std::vector<ChatMessage> done = chat_messages(q, at + ": completion");
  const size_t first = m.size();
  m.insert(m.end(), done.begin(), done.end());
  check(train_on_prompt || has_assistant(m, first),
        at + ": the completion holds no assistant turn, nothing to train on" + untrainable);
  c.segments = qwen3_chat_segments(m, static_cast<int64_t>(first));
  return c;
}

void tokenize(const Conversation& c, const Tokenizer& tok, bool all, std::vector<int32_t>* ids,
              std::vector<uint8_t>* trained) {
  for (const auto& s : c.segments) {
    tok.encode(s.text, false, false, ids);
    trained->resize(ids->size(), all || s.trained ? 1 : 0);
  }
  if (c.eos && tok.eos_id()) {
    ids->push_back(*tok.eos_id());
    trained->push_back(1);
  }
}

}  // namespace

ChatDocuments::ChatDocuments(const SourceOptions& o, const ChatOptions& opt,
                             std::shared_ptr<const Tokenizer> tok, ChatStats* stats)
    : tok_(std::move(tok)), packing_(opt.packing) {
  check(opt.truncation == "truncate" || opt.truncation == "drop",
        "sft.truncation '" + opt.truncation + "' must be truncate or drop");
  check(opt.packing_strategy == "bfd" || opt.packing_strategy == "wrapped",
        "sft.packing_strategy '" + opt.packing_strategy + "' must be bfd or wrapped");
  ChatStats local;
  ChatStats& st = stats ? *stats : local;
  st = ChatStats{};
  std::vector<Conversation> convs;
  read_json_records(o, &st.source,
                    [&](const json& j, const std::string& at, const std::string& what) {
                      try {
                        convs.push_back(parse_record(j, at, opt.train_on_prompt));
                      } catch (const Error& e) {
                        if (!o.skip_malformed) throw Error(e.what() + skip_malformed_hint(o, what));
                        if (st.bad_records++ == 0) st.first_bad = at;
                      }
                    });
  st.records = static_cast<int64_t>(convs.size());

  // Tokenize in parallel (the tokenizers are const and thread-safe), then keep in file order.
  const auto n = static_cast<int64_t>(convs.size());
  std::vector<std::vector<int32_t>> ids(convs.size());
  std::vector<std::vector<uint8_t>> trained(convs.size());
  std::exception_ptr failure;
#pragma omp parallel for schedule(dynamic, 8)
  for (int64_t i = 0; i < n; ++i) {
    try {
      tokenize(convs[i], *tok_, opt.train_on_prompt, &ids[i], &trained[i]);
    } catch (...) {
#pragma omp critical(titan_chat_tokenize_failure)
      if (!failure) failure = std::current_exception();
    }
  }
  if (failure) std::rethrow_exception(failure);
  std::vector<Conversation>().swap(convs);

  starts_.push_back(0);
  for (int64_t i = 0; i < n; ++i) {
    size_t len = ids[i].size();
    if (opt.max_tokens > 0 && static_cast<int64_t>(len) > opt.max_tokens) {
      if (opt.truncation == "drop") {
        ++st.dropped_long;
        continue;
      }
      ++st.truncated;
      len = static_cast<size_t>(opt.max_tokens);
    }
    // The loader trains on predicting ids 1.. of a conversation: one of them must be trained.
    bool any = false;
    for (size_t k = 1; k < len && !any; ++k) any = trained[i][k] != 0;
    if (!any) {
      ++st.dropped_untrained;
      continue;
    }
    ids_.insert(ids_.end(), ids[i].begin(), ids[i].begin() + static_cast<long>(len));
    trained_.insert(trained_.end(), trained[i].begin(),
                    trained[i].begin() + static_cast<long>(len));
    for (size_t k = 1; k < len; ++k) st.trained += trained[i][k];
    starts_.push_back(static_cast<int64_t>(ids_.size()));
    std::vector<int32_t>().swap(ids[i]);
    std::vector<uint8_t>().swap(trained[i]);
  }
  st.tokens = static_cast<int64_t>(ids_.size());
  if (opt.packing && opt.packing_strategy == "bfd" && opt.max_tokens > 1 && conversations() > 0)
    pack_best_fit(opt.max_tokens - 1);
  if (size() == 0) {
    std::string problems = describe_problems(st.source, o.text_field);
    const std::string chat = describe_chat_problems(st, opt);
    if (!chat.empty()) problems += (problems.empty() ? "" : "; ") + chat;
    throw Error("dataset 'chat' at '" + source_path(o) + "' has no conversations to train on" +
                (problems.empty() ? "" : " (" + problems + ")") + "; point " + o.section +
                ".dataset_path at chat records");
  }
}

void ChatDocuments::pack_best_fit(int64_t row) {
  const int64_t n = conversations();
  // A conversation of L ids fills L - 1 input positions (inputs ids[:-1], labels ids[1:]).
  const auto fill = [&](int64_t c) {
    return starts_[static_cast<size_t>(c) + 1] - starts_[static_cast<size_t>(c)] - 1;
  };
  std::vector<int64_t> order(static_cast<size_t>(n));
  for (int64_t c = 0; c < n; ++c) order[static_cast<size_t>(c)] = c;
  std::sort(order.begin(), order.end(),
            [&](int64_t a, int64_t b) {  // longest first, then file order
              return fill(a) != fill(b) ? fill(a) > fill(b) : a < b;
            });
  std::multimap<int64_t, size_t> room;  // room left -> row
  std::vector<std::vector<int64_t>> rows;
  int64_t used = 0;
  for (int64_t c : order) {
    const int64_t f = std::min(fill(c), row);
    used += f;
    auto it = room.lower_bound(f);  // the row with the least room that still fits
    int64_t left = row;
    size_t r = rows.size();
    if (it == room.end()) {
      rows.emplace_back();
    } else {
      left = it->first;
      r = it->second;
      room.erase(it);
    }
    rows[r].push_back(c);
    room.emplace(left - f, r);
  }
  for (auto& r : rows) std::sort(r.begin(), r.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a[0] < b[0]; });
  rows_.push_back(0);
  for (const auto& r : rows) {
    members_.insert(members_.end(), r.begin(), r.end());
    rows_.push_back(static_cast<int64_t>(members_.size()));
  }
  padding_ = 1.0 - static_cast<double>(used) / static_cast<double>(row * (rows_.size() - 1));
}

void ChatDocuments::conversation(int64_t c, std::vector<int32_t>* ids,
                                 std::vector<uint8_t>* trained) const {
  const auto a = starts_[static_cast<size_t>(c)], b = starts_[static_cast<size_t>(c) + 1];
  ids->insert(ids->end(), ids_.begin() + a, ids_.begin() + b);
  if (trained) trained->insert(trained->end(), trained_.begin() + a, trained_.begin() + b);
}

int64_t ChatDocuments::parts(int64_t i) const {
  if (rows_.empty()) return 1;
  return rows_[static_cast<size_t>(i) + 1] - rows_[static_cast<size_t>(i)];
}

void ChatDocuments::part_tokens(int64_t i, int64_t k, std::vector<int32_t>* ids,
                                std::vector<uint8_t>* trained) const {
  conversation(rows_.empty() ? i : members_[static_cast<size_t>(rows_[static_cast<size_t>(i)] + k)],
               ids, trained);
}

void ChatDocuments::tokens(int64_t i, std::vector<int32_t>* out) const {
  for (int64_t k = 0; k < parts(i); ++k) part_tokens(i, k, out, nullptr);
}

void ChatDocuments::trained_tokens(int64_t i, std::vector<int32_t>* ids,
                                   std::vector<uint8_t>* trained) const {
  for (int64_t k = 0; k < parts(i); ++k) part_tokens(i, k, ids, trained);
}

std::string ChatDocuments::vocab_source() const {
  return "dataloader.tokenizer '" + tok_->name() + "'";
}

bool is_chat_file(const std::string& file) {
  if (file_format("auto", file) != "jsonl") return false;
  io::check_input_file(file, "dataset file");
  std::ifstream f(file, std::ios::binary);
  std::string line;
  while (std::getline(f, line) && line.find_first_not_of(" \t\r\n") == std::string::npos) {
  }
  json j = json::parse(line, nullptr, false);
  if (j.is_discarded() && line.find_first_not_of(" \t\r") < line.size() &&
      line[line.find_first_not_of(" \t\r")] == '[') {  // a .json file holding one array
    std::ostringstream rest;
    rest << line << '\n' << f.rdbuf();
    j = json::parse(rest.str(), nullptr, false);
  }
  if (j.is_array() && !j.empty()) j = j[0];
  return j.is_object() &&
         (j.contains("messages") || (j.contains("prompt") && j.contains("completion")));
}

std::string describe_chat_problems(const ChatStats& s, const ChatOptions& opt) {
  std::string r;
  auto add = [&](const std::string& part) { r += (r.empty() ? "" : "; ") + part; };
  const int64_t all = s.records;
  const std::string longer = " of " + std::to_string(all) + " conversations longer than " +
                             std::to_string(opt.max_tokens) + " tokens (training.seq_len + 1) ";
  if (s.truncated > 0)
    add(std::to_string(s.truncated) + longer + "truncated to their first " +
        std::to_string(opt.max_tokens) + " (sft.truncation drop leaves them out)");
  if (s.dropped_long > 0)
    add(std::to_string(s.dropped_long) + longer + "dropped (sft.truncation drop)");
  if (s.dropped_untrained > 0)
    add("dropped " + std::to_string(s.dropped_untrained) + " of " + std::to_string(all) +
        " conversations with no trained token" +
        (s.truncated > 0 ? " (left after truncation)" : ""));
  if (s.bad_records > 0)
    add("skipped " + std::to_string(s.bad_records) + " malformed chat record(s) (first at " +
        s.first_bad + ")");
  return r;
}

namespace {
std::string packed_rows(const ChatDocuments& d) {
  char b[96];
  std::snprintf(b, sizeof b, ", best-fit packed into %lld rows, %.1f%% padding",
                static_cast<long long>(d.size()), 100.0 * d.padding_share());
  return b;
}
}  // namespace

std::shared_ptr<const DocumentSet> open_chat_dataset(const SourceOptions& o, const ChatOptions& opt,
                                                     std::shared_ptr<const Tokenizer> tok) {
  ChatStats st;
  auto d = std::make_shared<ChatDocuments>(o, opt, tok, &st);
  log::info(o.section + ": " + std::to_string(d->conversations()) + " conversations (" +
            std::to_string(st.tokens) + " tokens, " + std::to_string(st.trained) +
            " trained labels" +
            (opt.train_on_prompt ? ", sft.train_on_prompt" : ", assistant turns") +
            (!opt.packing  ? ", one per row"
             : d->packed() ? ", packed into rows (wrapped)"
                           : packed_rows(*d)) +
            ") in " + std::to_string(st.source.files) + " file(s) at " + source_path(o) +
            ", tokenizer " + tok->name());
  std::string problems = describe_problems(st.source, o.text_field);
  const std::string chat = describe_chat_problems(st, opt);
  if (!chat.empty()) problems += (problems.empty() ? "" : "; ") + chat;
  if (!problems.empty()) log::warn(o.section + ": " + problems);
  return d;
}

}  // namespace titan::data
