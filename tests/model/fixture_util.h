// Helpers for the model tests: a fixture folder of tests/data, its prompts and
// expected tensors (made by transformers), and the normalised error metric.
#pragma once

#include <algorithm>
#include <cctype>
#include <cmath>
#include <string>
#include <vector>

#include "../test_data.h"
#include "core/tensor.h"
#include "io/safetensors.h"

namespace kestrel::test {

// Every base-model fixture of tests/data (FIXTURES.md), for the suites that run them all.
inline const std::vector<std::string>& base_fixtures() {
  static const std::vector<std::string> names = {"falcon7b-mqa-parallel",
                                                 "legacy-rw-7b-config",
                                                 "falcon40b-gqa",
                                                 "legacy-rw-40b-config",
                                                 "rw-mha-sequential-bias",
                                                 "falcon180b-gqa-untied",
                                                 "falcon2-11b-style",
                                                 "falcon40b-hd64-gqa",
                                                 "falcon7b-hd128-mqa",
                                                 "e2e-falcon7b-fullvocab",
                                                 "rw-alibi-mha"};
  return names;
}

// A fixture name as a test-name suffix (gtest allows letters, digits and '_').
inline std::string fixture_test_name(std::string s) {
  for (char& c : s) c = std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  return s;
}

inline std::string fixture_dir(const std::string& name) {
  return test_data_dir() + "/" + name;
}

struct Expected {
  WeightStore store;
  std::vector<std::vector<int32_t>> prompts;

  explicit Expected(const std::string& name)
      : store(WeightStore::open_file(fixture_dir(name) + "/expected.safetensors")) {
    const TensorInfo& ids = store.get("prompt_ids");
    const TensorInfo& cu = store.get("cu_seqlens");
    const auto* idp = reinterpret_cast<const int64_t*>(ids.data);
    const auto* cup = reinterpret_cast<const int64_t*>(cu.data);
    for (int64_t p = 0; p + 1 < cu.shape[0]; ++p) {
      prompts.emplace_back(idp + cup[p], idp + cup[p + 1]);
    }
  }
  const float* f32(const std::string& name) const {
    return reinterpret_cast<const float*>(store.get(name).data);
  }
  const int64_t* i64(const std::string& name) const {
    return reinterpret_cast<const int64_t*>(store.get(name).data);
  }
};

// max |got - ref| / max |ref| over n values.
inline double rel_error(const float* got, const float* ref, size_t n) {
  double err = 0.0, mag = 0.0;
  for (size_t i = 0; i < n; ++i) {
    err = std::max(err, std::abs(static_cast<double>(got[i]) - ref[i]));
    mag = std::max(mag, std::abs(static_cast<double>(ref[i])));
  }
  return mag > 0 ? err / mag : err;
}

inline double rel_error(const Tensor& got, const Tensor& ref) {
  return rel_error(got.data<float>(), ref.data<float>(), static_cast<size_t>(ref.numel()));
}

}  // namespace kestrel::test
