// `kestrel serve` and its LoRA adapter flags: a bad --adapter stops start-up naming it and the
// reason; good ones are preloaded before the server listens, and it stops cleanly on SIGTERM.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "../model/fixture_util.h"
#include "run_kestrel.h"

namespace kestrel {
namespace {

namespace fs = std::filesystem;
using test::fixture_dir;

std::string serve(const std::string& flags) {
  return "serve --model " + fixture_dir("e2e-falcon7b-fullvocab") + " --port 0 " + flags;
}

TEST(ServeAdapterCli, BadAdapterStopsStartUpNamingIt) {
  const std::string good = fixture_dir("lora-e2e-falcon7b-fullvocab/adapters/e1-r8-all");
  test::CmdResult r =
      test::run_kestrel(serve("--adapter good=" + good + " --adapter bad=/nonexistent"), true);
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.out.find("--adapter bad=/nonexistent"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("/nonexistent does not exist"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("preloaded good"), std::string::npos) << r.out;  // in order
  EXPECT_EQ(r.out.find("kestrel serving"), std::string::npos) << r.out;
  // An adapter made for another model: the loader's shape error.
  const std::string other = fixture_dir("lora-falcon40b-gqa/adapters/a1-r8-attn");
  r = test::run_kestrel(serve("--adapter other=" + other), true);
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.out.find("--adapter other="), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("the base model needs"), std::string::npos) << r.out;
  r = test::run_kestrel(serve("--adapter " + good), true);
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.out.find("expects NAME=DIR"), std::string::npos) << r.out;
  r = test::run_kestrel(serve("--adapters-dir /nonexistent-adapters"), true);
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.out.find("--adapters-dir /nonexistent-adapters is not a folder"), std::string::npos)
      << r.out;
  r = test::run_kestrel(
      serve("--max-loaded-adapters 1 --adapter a=" + good + " --adapter b=" + good), true);
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.out.find("--max-loaded-adapters is 1"), std::string::npos) << r.out;
}

TEST(ServeAdapterCli, PreloadsThenServesAndStops) {
  const fs::path dir = fs::temp_directory_path() / ("kestrel_serve_ad_" + std::to_string(getpid()));
  fs::create_directories(dir);
  const std::string good = fixture_dir("lora-e2e-falcon7b-fullvocab/adapters/e1-r8-all");
  const std::string out = (dir / "out").string();  // stdout and stderr, in order
  // Start, wait for the listening line, SIGTERM, report the exit status.
  const std::string script =
      test::kestrel_binary() + " " + serve("--adapter e1=" + good + " --adapter-memory 1") + " >" +
      out + " 2>&1 & p=$!; for i in $(seq 300); do grep -q 'kestrel " + "serving' " + out +
      " && break; sleep 0.1; done; kill -TERM $p; " + "wait $p; echo $?";
  FILE* p = popen(script.c_str(), "r");  // sh -c
  ASSERT_NE(p, nullptr);
  char buf[64] = {0};
  const size_t n = fread(buf, 1, sizeof(buf) - 1, p);
  pclose(p);
  const std::string status(buf, n);
  std::stringstream log;
  log << std::ifstream(out).rdbuf();
  EXPECT_EQ(status, "0\n") << log.str();
  const std::string s = log.str();
  EXPECT_NE(s.find("preloaded e1"), std::string::npos) << s;
  EXPECT_NE(s.find("up to 16 adapters in 1.0 MiB (--adapter-memory"), std::string::npos) << s;
  EXPECT_NE(s.find("kestrel serving"), std::string::npos) << s;
  EXPECT_LT(s.find("preloaded e1"), s.find("kestrel serving")) << s;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace kestrel

namespace kestrel {
namespace {

// `serve --preset`: random weights need a tokenizer whose ids fit the preset's vocabulary, and
// exclude --model; each refusal names what is wrong before anything is served.
TEST(ServePresetCli, RefusesWhatCannotServe) {
  const std::string tok = fixture_dir("tokenizer/falcon-tokenizer.json");
  test::CmdResult r = test::run_kestrel("serve --preset tiny --port 0", true);
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.out.find("serve --preset needs --tokenizer FILE"), std::string::npos) << r.out;
  r = test::run_kestrel("serve --preset tiny --tokenizer " + tok + " --port 0", true);
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.out.find("the tokenizer has 65024 tokens, the model's vocabulary 1024"),
            std::string::npos)
      << r.out;
  r = test::run_kestrel("serve --preset falcon-9b --tokenizer " + tok + " --port 0", true);
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.out.find("falcon-9b"), std::string::npos) << r.out;
  r = test::run_kestrel(
      "serve --preset tiny --model " + fixture_dir("e2e-falcon7b-fullvocab") + " --port 0", true);
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.out.find("excludes"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("kestrel serving"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace kestrel
