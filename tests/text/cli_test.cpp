// Runs the kestrel binary: `tokenize --json` prints the ids and vocabulary
// spellings, `detokenize` prints the text back, errors exit 1.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "test_util.h"

namespace kestrel::text {
namespace {

struct Result {
  int status;
  std::string out;
};

Result run(const std::string& args) {
  const std::string cmd = test::kestrel_binary() + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  const int status = pclose(p);
  return {WEXITSTATUS(status), out};
}

const std::string kTok = "--tokenizer " + testing::data_path("falcon-tokenizer.json");

TEST(CliTest, TokenizeJson) {
  const Result r = run("tokenize " + kTok + " --text 'Hello world' --json");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(r.out, "{\"ids\":[9856,1079],\"tokens\":[\"Hello\",\"Ġworld\"]}\n");
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["ids"], nlohmann::json({9856, 1079}));
}

TEST(CliTest, TokenizeFileReadable) {
  const std::string path = std::filesystem::temp_directory_path() / "kestrel_cli_tok.txt";
  {
    std::ofstream f(path);
    f << ">>QUESTION<<What is 2+2?";
  }
  const Result r = run("tokenize " + kTok + " --file " + path);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("tokens"), std::string::npos);
  EXPECT_NE(r.out.find("(special)"), std::string::npos);
  std::filesystem::remove(path);
}

TEST(CliTest, Detokenize) {
  const Result r = run("detokenize " + kTok + " --ids 9856,1079");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(r.out, "Hello world\n");
}

TEST(CliTest, ErrorsExitOne) {
  const Result bad_ids = run("detokenize " + kTok + " --ids 1,x");
  EXPECT_EQ(bad_ids.status, 1);
  EXPECT_NE(bad_ids.out.find("'x' is not a token id"), std::string::npos) << bad_ids.out;
  const Result bad_utf8 = run("tokenize " + kTok + " --text \"$(printf '\\377')\"");
  EXPECT_EQ(bad_utf8.status, 1);
  EXPECT_NE(bad_utf8.out.find("not valid UTF-8"), std::string::npos) << bad_utf8.out;
  const Result missing = run("tokenize --model /nonexistent --text hi");
  EXPECT_EQ(missing.status, 1);
  EXPECT_NE(missing.out.find("has no tokenizer.json"), std::string::npos) << missing.out;
}

}  // namespace
}  // namespace kestrel::text
