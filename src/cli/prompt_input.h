// Prompts from the command line: a PROMPTS.json of token ids, and the model
// folder's tokenizer when it has one (shared by logits, generate and bench).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "text/tokenizer.h"

namespace kestrel::cli {

// PROMPTS.json: [[ids...], ...], each a non-empty array of non-negative ids.
std::vector<std::vector<int32_t>> read_token_ids(const std::string& path);

// The folder's tokenizer.json, or nullopt when it has none.
std::optional<text::Tokenizer> maybe_tokenizer(const std::string& model_dir);

}  // namespace kestrel::cli
