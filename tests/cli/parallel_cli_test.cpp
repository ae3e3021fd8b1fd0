// --tensor-parallel / --num-shard from the command line: logits and greedy generate at N = 2 and 3
// equal N = 1; --verbose prints each rank's weight bytes; bad N fails with a clear message before
// any weight is read.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>
#include "run_kestrel.h"

#include "../model/fixture_util.h"
#include "io/safetensors.h"

namespace kestrel {
namespace {

namespace fs = std::filesystem;
using test::fixture_dir;
using test::rel_error;

using test::CmdResult;

CmdResult kestrel(const std::string& args, bool with_stderr = true) {
  return test::run_kestrel(args, with_stderr);
}

class ParallelCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("kestrel_tp_cli_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    prompts_ = (dir_ / "prompts.json").string();
    std::ofstream(prompts_) << "[[1, 2, 3, 4, 5, 6, 7], [42, 17, 99]]";
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
  std::string prompts_;
};

TEST_F(ParallelCli, LogitsEqualSingleRank) {
  const std::string model = fixture_dir("falcon40b-gqa");
  auto logits = [&](const std::string& flag, const std::string& name) {
    const std::string out = (dir_ / name).string();
    CmdResult r =
        kestrel("logits --model " + model + " --token-ids " + prompts_ + " --out " + out + flag);
    EXPECT_EQ(r.status, 0) << r.out;
    return WeightStore::open_file(out);
  };
  const WeightStore one = logits("", "one.safetensors");
  for (const std::string flag : {" --tensor-parallel 2", " --num-shard 3"}) {
    const WeightStore tp = logits(flag, "tp.safetensors");
    const TensorInfo& a = tp.get("logits");
    const TensorInfo& b = one.get("logits");
    ASSERT_EQ(a.shape, b.shape) << flag;
    EXPECT_LE(rel_error(reinterpret_cast<const float*>(a.data),
                        reinterpret_cast<const float*>(b.data), shape_numel(a.shape)),
              1e-5)
        << flag;
  }
}

// Two and three processes (--nnodes, ranks joined over TCP on localhost) give the same bits as
// the same ranks as threads of one process: the TCP all-reduce sums ranks in the same order.
TEST_F(ParallelCli, ProcessesEqualThreadsBitForBit) {
  const std::string model = fixture_dir("falcon40b-gqa");
  const std::string base = "logits --model " + model + " --token-ids " + prompts_;
  for (int n : {2, 3}) {
    const std::string threads_out = (dir_ / ("threads" + std::to_string(n))).string();
    CmdResult t =
        kestrel(base + " --tensor-parallel " + std::to_string(n) + " --out " + threads_out);
    ASSERT_EQ(t.status, 0) << t.out;
    const int port = 20000 + (::getpid() * 7 + n) % 20000;
    const std::string procs_out = (dir_ / ("procs" + std::to_string(n))).string();
    std::string cmd;  // ranks 1..n-1 in the background, rank 0 in front, then wait for all
    for (int r = n - 1; r >= 0; --r) {
      cmd += test::kestrel_binary() + " " + base + " --out " + procs_out + " --nnodes " +
             std::to_string(n) + " --node-rank " + std::to_string(r) + " --master-port " +
             std::to_string(port) + (r > 0 ? " >/dev/null 2>&1 & " : " 2>&1; wait");
    }
    FILE* p = popen(("sh -c '" + cmd + "'").c_str(), "r");
    ASSERT_NE(p, nullptr);
    std::string out;
    std::array<char, 4096> buf;
    size_t got;
    while ((got = fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), got);
    ASSERT_EQ(pclose(p), 0) << out;
    const WeightStore a = WeightStore::open_file(threads_out),
                      b = WeightStore::open_file(procs_out);
    const TensorInfo &la = a.get("logits"), &lb = b.get("logits");
    ASSERT_EQ(la.shape, lb.shape);
    EXPECT_EQ(std::memcmp(la.data, lb.data, la.nbytes), 0) << "N = " << n;
  }
}

TEST_F(ParallelCli, ProcessOptionsAreChecked) {
  const std::string base = "logits --model " + fixture_dir("falcon40b-gqa") + " --token-ids " +
                           prompts_ + " --out " + (dir_ / "x").string();
  CmdResult r = kestrel(base + " --nnodes 2 --node-rank 2");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.out.find("--node-rank 2 outside [0, 2)"), std::string::npos) << r.out;
  r = kestrel(base + " --nnodes 2 --tensor-parallel 4");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.out.find("each process is one rank"), std::string::npos) << r.out;
}

TEST_F(ParallelCli, GreedyGenerateEqualsSingleRank) {
  const std::string base = "generate --model " + fixture_dir("falcon7b-mqa-parallel") +
                           " --token-ids " + prompts_ +
                           " --max-new-tokens 10 --greedy --ignore-eos --json";
  CmdResult one = kestrel(base, false);
  ASSERT_EQ(one.status, 0) << one.out;
  CmdResult two = kestrel(base + " --tensor-parallel 2", false);
  ASSERT_EQ(two.status, 0) << two.out;
  auto ids = [](const std::string& out) {
    std::vector<std::vector<int>> all;
    const nlohmann::json j = nlohmann::json::parse(out);
    for (const auto& o : j.at("outputs")) all.push_back(o["token_ids"].get<std::vector<int>>());
    return all;
  };
  EXPECT_EQ(ids(two.out), ids(one.out));
  EXPECT_EQ(ids(one.out).size(), 2u);
}

TEST_F(ParallelCli, VerbosePrintsEachRanksBytes) {
  CmdResult r =
      kestrel("logits --model " + fixture_dir("falcon40b-gqa") + " --token-ids " + prompts_ +
              " --out " + (dir_ / "x.safetensors").string() + " --tensor-parallel 2 --verbose");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("rank 0/2: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("rank 1/2: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("weight bytes"), std::string::npos) << r.out;
}

TEST_F(ParallelCli, BadRankCountsFailBeforeWeightsAreRead) {
  // config.json of a 4-head model, weights that are not safetensors at all.
  const fs::path bad = dir_ / "bad";
  fs::create_directories(bad);
  fs::copy_file(fixture_dir("falcon7b-mqa-parallel") + "/config.json", bad / "config.json");
  std::ofstream(bad / "model.safetensors") << "garbage";
  const std::string args = " --model " + bad.string() + " --token-ids " + prompts_;
  for (const char* cmd : {"logits --out /dev/null", "generate --max-new-tokens 2"}) {
    CmdResult zero = kestrel(std::string(cmd) + args + " --tensor-parallel 0");
    EXPECT_EQ(zero.status, 1);
    EXPECT_NE(zero.out.find("--tensor-parallel must be >= 1, got 0"), std::string::npos)
        << zero.out;
    CmdResult many = kestrel(std::string(cmd) + args + " --num-shard 5");
    EXPECT_EQ(many.status, 1);
    EXPECT_NE(many.out.find("more than the model's 4 query heads"), std::string::npos) << many.out;
  }
  // A valid N reaches the weights (and fails there, naming the file).
  CmdResult ok = kestrel("logits --out /dev/null" + args + " --tensor-parallel 2");
  EXPECT_EQ(ok.status, 1);
  EXPECT_NE(ok.out.find("model.safetensors"), std::string::npos) << ok.out;
}

}  // namespace
}  // namespace kestrel
