// Shared helpers of the tokenizer tests: the Falcon tokenizer, loaded once, and
// the test vectors of tests/data/tokenizer.
#pragma once

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "../test_data.h"
#include "text/tokenizer.h"

namespace kestrel::text::testing {

inline std::string data_path(const std::string& name) {
  return test::test_data_dir() + "/tokenizer/" + name;
}

inline std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline const Tokenizer& falcon() {
  static const Tokenizer tok = Tokenizer::from_file(data_path("falcon-tokenizer.json"));
  return tok;
}

struct Vector {
  std::string text;
  std::vector<int32_t> ids;
  std::string decoded;
};

// vectors.json: [{"text", "ids", "decoded"}].
inline std::vector<Vector> hf_vectors() {
  std::vector<Vector> out;
  for (const auto& v : nlohmann::json::parse(read_all(data_path("vectors.json")))) {
    out.push_back({v["text"], v["ids"].get<std::vector<int32_t>>(), v["decoded"]});
  }
  return out;
}

// llama.cpp's test-tokenizer format: cases separated by "\n__ggml_vocab_test__\n"
// in .inp, one line of space-separated ids per case in .out.
inline std::vector<Vector> llamacpp_vectors() {
  const std::string inp = read_all(data_path("llamacpp-vectors.inp"));
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> texts;
  for (size_t pos = 0;;) {
    const size_t next = inp.find(sep, pos);
    if (next == std::string::npos) break;
    texts.push_back(inp.substr(pos, next - pos));
    pos = next + sep.size();
  }
  std::istringstream out(read_all(data_path("llamacpp-vectors.out")));
  std::vector<Vector> cases;
  std::string line;
  for (const auto& t : texts) {
    std::getline(out, line);
    std::istringstream ids(line);
    Vector v{t, {}, t};
    for (int32_t id; ids >> id;) v.ids.push_back(id);
    cases.push_back(std::move(v));
  }
  return cases;
}

}  // namespace kestrel::text::testing
