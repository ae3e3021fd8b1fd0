// `kestrel bench --device cpu`'s engine benchmark from the command line: one
// JSON entry per concurrency level, with consistent throughput figures.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <array>
#include <cstdio>

#include <nlohmann/json.hpp>
#include "run_kestrel.h"

namespace kestrel {
namespace {

std::string run(const std::string& args, int* status) {
  test::CmdResult r = test::run_kestrel(args, false);
  *status = r.status;
  return r.out;
}

TEST(BenchCli, EngineBenchmarkPerConcurrencyLevel) {
  int status = -1;
  const std::string out =
      run("bench --device cpu --preset tiny --prefill '' --decode '' --first-token-prompt 0 "
          "--engine-concurrency 1,4 --engine-prompt 20 --engine-new 5 --engine-requests 8 --json",
          &status);
  ASSERT_EQ(status, 0);
  const nlohmann::json j = nlohmann::json::parse(out);  // stdout holds only the JSON
  ASSERT_EQ(j["engine"].size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    const auto& e = j["engine"][i];
    EXPECT_EQ(e["concurrency"], i == 0 ? 1 : 4);
    EXPECT_EQ(e["requests"], 8);
    EXPECT_GT(e["requests_s"].get<double>(), 0);
    // Every request generates exactly 5 tokens (EOS ignored).
    EXPECT_NEAR(e["tok_s"].get<double>(), 5 * e["requests_s"].get<double>(),
                1e-6 * e["tok_s"].get<double>());
    // At least one step per generated token of the longest chain, at most one per token.
    EXPECT_GE(e["steps"].get<int64_t>(), 8 * 5 / (i == 0 ? 1 : 4));
    EXPECT_GE(e["overhead_ms_mean"].get<double>(), 0);
    EXPECT_GE(e["overhead_ms_p99"].get<double>(), 0);
    EXPECT_GT(e["model_ms_per_step"].get<double>(), 0);
  }
  // With one request in flight, no step can batch two requests' decodes.
  EXPECT_EQ(j["engine"][0]["steps"], 8 * 5);
  EXPECT_LT(j["engine"][1]["steps"].get<int64_t>(), 8 * 5);
}

TEST(BenchCli, BadConcurrencyIsAnError) {
  int status = -1;
  run("bench --device cpu --preset tiny --prefill '' --decode '' --first-token-prompt 0 "
      "--engine-concurrency 0",
      &status);
  EXPECT_EQ(status, 1);
}

}  // namespace
}  // namespace kestrel
