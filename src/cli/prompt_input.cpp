// Reading prompts for the model commands: token-id files and the tokenizer.
#include "cli/prompt_input.h"

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace kestrel::cli {

std::vector<std::vector<int32_t>> read_token_ids(const std::string& path) {
  std::ifstream in(path);
  KESTREL_CHECK(in.good(), "cannot open ", path);
  nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  KESTREL_CHECK(!j.is_discarded(), path, ": not valid JSON");
  KESTREL_CHECK(j.is_array() && !j.empty(), path, ": expected a non-empty array of prompts");
  std::vector<std::vector<int32_t>> prompts;
  for (size_t i = 0; i < j.size(); ++i) {
    KESTREL_CHECK(j[i].is_array() && !j[i].empty(), path, ": prompt ", i,
                  " must be a non-empty array of token ids");
    std::vector<int32_t> ids;
    for (const auto& v : j[i]) {
      KESTREL_CHECK(v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() <= INT32_MAX,
                    path, ": prompt ", i, " holds ", v.dump(), ", not a token id");
      ids.push_back(static_cast<int32_t>(v.get<int64_t>()));
    }
    prompts.push_back(std::move(ids));
  }
  return prompts;
}

std::optional<text::Tokenizer> maybe_tokenizer(const std::string& dir) {
  if (!std::filesystem::exists(std::filesystem::path(dir) / "tokenizer.json")) return std::nullopt;
  return text::Tokenizer::from_model_dir(dir);
}

}  // namespace kestrel::cli
