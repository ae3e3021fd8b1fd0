// What the merge tests share: a merge of tests/data/merge-falcon7b/fixture.json as a MergeSpec.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "lora/merge.h"

namespace kestrel::test {

inline MergeSpec merge_spec_of(const nlohmann::json& merge) {
  MergeSpec s;
  s.ids = merge.at("adapters").get<std::vector<std::string>>();
  s.weights = merge.at("weights").get<std::vector<double>>();
  s.strategy = parse_merge_strategy(merge.at("strategy").get<std::string>());
  if (merge.contains("density") && !merge.at("density").is_null())
    s.density = merge.at("density").get<double>();
  if (merge.contains("majority_sign_method"))
    s.majority_sign_method =
        parse_majority_sign_method(merge.at("majority_sign_method").get<std::string>());
  if (merge.contains("seed")) s.seed = merge.at("seed").get<uint64_t>();
  return s;
}

}  // namespace kestrel::test
