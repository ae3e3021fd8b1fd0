// kestrel's tokenizer: reads a Hugging Face tokenizer.json (byte-level BPE, as
// Falcon ships it) and encodes and decodes exactly as HF tokenizers does.
// Copies share one loaded model; every const method is safe from many threads.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kestrel::text {

class Tokenizer {
 public:
  // Loads tokenizer.json at `path`, and tokenizer_config.json beside it if present.
  static Tokenizer from_file(const std::filesystem::path& path);
  // Loads <dir>/tokenizer.json (and <dir>/tokenizer_config.json if present).
  static Tokenizer from_model_dir(const std::filesystem::path& dir);
  // From the texts of tokenizer.json and (optionally) tokenizer_config.json.
  static Tokenizer from_json(std::string_view tokenizer_json, std::string_view config_json = {});

  // Token ids of `text`, which must be valid UTF-8 (else kestrel::Error).
  // Added tokens in the text are always recognised; add_special_tokens adds the
  // bos/eos that tokenizer_config.json asks for (add_bos_token, add_eos_token).
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = true) const;

  // Text of `ids`; unknown ids are skipped, invalid UTF-8 becomes U+FFFD.
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;

  // The token as spelled in the vocabulary (byte-level: "Ġworld"); throws for
  // an id that names no token.
  std::string_view token(int32_t id) const;
  std::optional<int32_t> token_id(std::string_view token) const;
  // One past the largest id of the vocabulary and the added tokens.
  int32_t vocab_size() const;
  std::optional<int32_t> bos_id() const;
  std::optional<int32_t> eos_id() const;
  bool is_special(int32_t id) const;

  struct Impl;

 private:
  explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

// Streaming decode with TGI's prefix/read offsets: push() returns only text
// that is complete UTF-8 and will not change, so the concatenation of all
// push() results and flush() equals decode() of all the pushed ids.
class IncrementalDetokenizer {
 public:
  // prompt_ids give the decoder context; their own text is never returned.
  explicit IncrementalDetokenizer(const Tokenizer& tokenizer, std::vector<int32_t> prompt_ids = {},
                                  bool skip_special = false);

  // Adds one generated id; returns the newly stable text, maybe "".
  std::string push(int32_t id);
  // Returns whatever is still held back (e.g. an incomplete UTF-8 tail as U+FFFD).
  std::string flush();

 private:
  Tokenizer tokenizer_;
  std::vector<int32_t> ids_;
  size_t prefix_offset_ = 0;
  size_t read_offset_ = 0;
  bool skip_special_ = false;
};

}  // namespace kestrel::text
