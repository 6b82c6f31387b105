// Chat fine-tuning data (dataloader.dataset chat, or auto on JSON lines of conversations): every
// record rendered with Qwen3's chat template (chat_template.h) and tokenized with a per-token
// "trained" flag, which the packed loader turns into labels (-100 where not trained). Records,
// one JSON object a line (or the elements of a .json file holding one array), in the Hugging
// Face / TRL shapes:
//   {"messages": [{"role": "system"|"user"|"assistant"|"tool", "content": "...",
//                  "reasoning_content": "..." (assistant turns, optional)}, ...]}
//   {"prompt": [messages], "completion": [messages]}  conversational prompt-completion: the
//       prompt's turns are never trained, the completion's assistant turns are;
//   {"prompt": "text", "completion": "text"}  plain text, no template: the prompt is not trained,
//       the completion and the tokenizer's EOS appended after it are (TRL's prompt-completion).
// A conversation's document is the template's text alone (no BOS/EOS around it). The loss mask
// (train_on_prompt off): each assistant turn's text after its "<|im_start|>assistant\n" header
// through its "<|im_end|>" is trained, everything else (system, user and tool turns, headers,
// the "\n" after <|im_end|>) is not; train_on_prompt trains every token. Each segment is
// tokenized on its own, which gives the ids of the whole rendering (the boundary rule in
// chat_template.h); a plain prompt and completion are tokenized apart too, so a word split
// across them stays two tokens (end the prompt at a word boundary: " Paris", not "Par"+"is").
// Length: a conversation of more than max_tokens ids (training.seq_len + 1: one full row of
// inputs and labels) is cut to its first max_tokens ids ("truncate", packed or not) or left out
// ("drop"); with packing the rows are cut from the stream of conversations as for text, so a
// conversation may still continue in the next row (its positions re-based to 0 there).
// Conversations left without a trained label (no assistant turn kept after truncation) are
// dropped. Each is counted and reported in one log line.
// Packing (sft.packing_strategy): "bfd" (the default, as TRL's) fills rows with whole
// conversations by best-fit decreasing (longest first, each into the row with the least room
// that still fits it, a new row when none does; rows then ordered by their first conversation
// in the file) and pads the rest of each row, so that no conversation is split; "wrapped" cuts
// one stream of conversations into rows, as for text, without padding.
// Malformed records (not an object, neither "messages" nor "prompt" and "completion", a message
// without a string role or content, an unknown role, prompt and completion of different kinds,
// no assistant turn to train while train_on_prompt is off) stop with file:line, or are skipped
// and counted under skip_malformed, as JSON lines of text are (text_source.h).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "titan/data/dataset.h"

namespace titan::data {

// What reading and tokenizing found, for the one-line report.
struct ChatStats {
  SourceStats source;   // files, invalid UTF-8, malformed JSON lines
  int64_t records = 0;  // well-formed conversations read
  int64_t truncated = 0, dropped_long = 0, dropped_untrained = 0;
  int64_t bad_records = 0;          // skipped under skip_malformed
  std::string first_bad;            // file:line of the first of them
  int64_t tokens = 0, trained = 0;  // of the conversations kept
};

class ChatDocuments final : public DocumentSet {
 public:
  // Reads every record of o.path (read_json_records) and tokenizes it (in parallel), applying
  // opt's mask and length rules; stats (when not null) receives the counts.
  ChatDocuments(const SourceOptions& o, const ChatOptions& opt,
                std::shared_ptr<const Tokenizer> tok, ChatStats* stats = nullptr);
  // The documents: one per conversation, or with best-fit packing one per row (its parts the
  // row's conversations).
  int64_t size() const override {
    return static_cast<int64_t>((rows_.empty() ? starts_.size() : rows_.size())) - 1;
  }
  void tokens(int64_t i, std::vector<int32_t>* out) const override;
  bool has_mask() const override { return true; }
  void trained_tokens(int64_t i, std::vector<int32_t>* ids,
                      std::vector<uint8_t>* trained) const override;
  int64_t vocab_size() const override { return tok_->vocab_size(); }
  std::string vocab_source() const override;
  bool packed() const override { return packing_ && rows_.empty(); }
  int64_t parts(int64_t i) const override;
  void part_tokens(int64_t i, int64_t k, std::vector<int32_t>* ids,
                   std::vector<uint8_t>* trained) const override;
  const std::shared_ptr<const Tokenizer>& tokenizer() const { return tok_; }
  // Best-fit packing: the conversations, how many rows they fill and the padding among the rows'
  // seq_len input positions (0 without it).
  int64_t conversations() const { return static_cast<int64_t>(starts_.size()) - 1; }
  double padding_share() const { return padding_; }

 private:
  // Fills rows of `row` input positions with whole conversations (best-fit decreasing).
  void pack_best_fit(int64_t row);
  // Conversation c's ids and flags (when trained is not null), appended.
  void conversation(int64_t c, std::vector<int32_t>* ids, std::vector<uint8_t>* trained) const;
  std::shared_ptr<const Tokenizer> tok_;
  bool packing_ = true;
  std::vector<int64_t> rows_;     // best-fit packing: first entry of each row in members_, total
  std::vector<int64_t> members_;  // the rows' conversations, row by row
  double padding_ = 0;
  std::vector<int32_t> ids_;      // every kept conversation's ids, back to back
  std::vector<uint8_t> trained_;  // per id: trained (1) or not (0)
  std::vector<int64_t> starts_;   // first id of each conversation, then the total
};

// Whether a dataset file reads as chat records: JSON lines (or a .json array) whose first record
// is an object with "messages", or with "prompt" and "completion".
bool is_chat_file(const std::string& file);

// The report line of ChatStats ("" when nothing was truncated, dropped or skipped).
std::string describe_chat_problems(const ChatStats& s, const ChatOptions& opt);

// ChatDocuments over o, logged (one line of counts, one of problems): open_dataset's chat path.
std::shared_ptr<const DocumentSet> open_chat_dataset(const SourceOptions& o, const ChatOptions& opt,
                                                     std::shared_ptr<const Tokenizer> tok);

}  // namespace titan::data
