// The pre-tokenizer chain of tokenizer.json (Sequence, Punctuation, ByteLevel,
// Digits, Split): cuts a text into the words the BPE model encodes, exactly as
// HF tokenizers' PreTokenizedString::split does.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "text/regex.h"

namespace kestrel::text {

// What happens to the delimiters a pattern matches (HF SplitDelimiterBehavior).
enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

SplitBehavior parse_split_behavior(std::string_view name);

// A piece of a string: [start, end) bytes, and whether the pattern matched it.
struct Segment {
  size_t start;
  size_t end;
  bool is_match;
};

// Turns segments covering a string into the kept [start, end) ranges under
// `behavior`; empty ranges are dropped, as PreTokenizedString::split does.
void apply_split_behavior(const std::vector<Segment>& segments, SplitBehavior behavior,
                          std::vector<std::pair<size_t, size_t>>& out);

// Receives the words of a text, in order.
class WordSink {
 public:
  virtual void word(std::string_view w) = 0;

 protected:
  ~WordSink() = default;
};

class PreTokenizer {
 public:
  struct Stage;
  // Reusable buffers for run(); one per encode call, not shared between threads.
  struct Scratch {
    struct Level {
      std::vector<Segment> segments;
      std::vector<std::pair<size_t, size_t>> ranges;
      std::vector<std::pair<size_t, size_t>> matches;
      std::string prefixed;
      std::string mapped;
    };
    std::vector<Level> levels;
  };

  // Builds the chain from tokenizer.json's "pre_tokenizer" (null: no splitting).
  // Throws kestrel::Error naming any unsupported type or bad field.
  static PreTokenizer from_json(const nlohmann::json& j);

  PreTokenizer();
  ~PreTokenizer();
  PreTokenizer(PreTokenizer&&) noexcept;
  PreTokenizer& operator=(PreTokenizer&&) noexcept;

  // Whether some stage maps bytes to GPT-2's byte-level alphabet.
  bool has_byte_level() const { return has_byte_level_; }

  // Splits `text` and hands every non-empty word to sink. Thread-safe.
  void run(std::string_view text, Scratch& scratch, WordSink& sink) const;

 private:
  void run_stage(size_t level, std::string_view piece, Scratch& scratch, WordSink& sink) const;
  void add_stage(const nlohmann::json& j);

  std::vector<std::unique_ptr<Stage>> stages_;
  bool has_byte_level_ = false;
};

}  // namespace kestrel::text
