// Structured output's per-step CPU cost: filling the token bitmasks of R constrained rows (the
// engine does it while the device runs the forward), and one schema's compile. The matchers stand
// at random points of bench/schemas/orders.json, reached by random allowed tokens.
//   grammar_bench TOKENIZER.json [SCHEMA.json] [--benchmark_filter=...]
#include <benchmark/benchmark.h>

#include <fstream>
#include <iostream>
#include <iterator>
#include <random>
#include <thread>

#include "grammar/constraint.h"
#include "text/tokenizer.h"

namespace {

using namespace kestrel;  // NOLINT(google-build-using-namespace): a benchmark's main file

std::unique_ptr<text::Tokenizer> g_tok;
std::string g_schema;
constexpr int64_t kVocab = 65024;
constexpr int32_t kEos = 11;

std::shared_ptr<const grammar::Compiled> compile_wait(grammar::Compiler& c, const std::string& s) {
  auto p = c.compile({grammar::Spec::Kind::kJsonSchema, s, "schema"});
  while (!p->ready()) std::this_thread::sleep_for(std::chrono::microseconds(200));
  return p->grammar();
}

// Walks a matcher `steps` random allowed tokens into the document.
void walk(grammar::Matcher& m, int64_t words, int steps, std::mt19937& rng) {
  std::vector<int32_t> mask(words);
  for (int s = 0; s < steps; ++s) {
    grammar::fill_bitmasks({&m}, mask.data(), words, 1);
    std::vector<int32_t> ok;
    for (int32_t id = 0; id < kVocab; ++id) {
      if (id != kEos && ((static_cast<uint32_t>(mask[id >> 5]) >> (id & 31)) & 1u))
        ok.push_back(id);
    }
    if (ok.empty()) return;
    m.accept(ok[rng() % ok.size()]);
  }
}

void BM_FillBitmasks(benchmark::State& state) {
  const int rows = static_cast<int>(state.range(0)), threads = static_cast<int>(state.range(1));
  grammar::Compiler c(*g_tok, kVocab, kEos, {});
  auto g = compile_wait(c, g_schema);
  std::mt19937 rng(1);
  std::vector<grammar::Matcher> ms;
  for (int r = 0; r < rows; ++r) {
    ms.emplace_back(g);
    walk(ms.back(), c.bitmask_words(), 8 + static_cast<int>(rng() % 48), rng);
  }
  std::vector<grammar::Matcher*> ptrs;
  for (auto& m : ms) ptrs.push_back(&m);
  std::vector<int32_t> bitmask(rows * c.bitmask_words());
  for (auto _ : state) {
    grammar::fill_bitmasks(ptrs, bitmask.data(), c.bitmask_words(), threads);
    benchmark::DoNotOptimize(bitmask.data());
  }
  // Seconds per row (the rate of rows, inverted).
  state.counters["per_row"] = benchmark::Counter(
      rows, benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_FillBitmasks)
    ->ArgsProduct({{1, 16, 64}, {1, 8}})
    ->ArgNames({"rows", "threads"})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

void BM_Compile(benchmark::State& state) {
  int i = 0;
  grammar::Compiler c(*g_tok, kVocab, kEos, {1, 1});
  for (auto _ : state) {       // a fresh schema each time (the cache holds one entry)
    std::string s = g_schema;  // every "id" renamed: the property and its `required` entry
    const std::string to = "\"id" + std::to_string(i++) + "\"";
    for (size_t at = s.find("\"id\""); at != std::string::npos; at = s.find("\"id\"", at + 1)) {
      s.replace(at, 4, to);
    }
    benchmark::DoNotOptimize(compile_wait(c, s));
  }
}
BENCHMARK(BM_Compile)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(5);

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (argc < 2) {
    std::cerr << "usage: grammar_bench TOKENIZER.json [SCHEMA.json]\n";
    return 2;
  }
  g_tok = std::make_unique<text::Tokenizer>(text::Tokenizer::from_file(argv[1]));
  std::ifstream in(argc > 2 ? argv[2] : "bench/schemas/orders.json");
  g_schema.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  if (g_schema.empty()) {
    std::cerr << "no schema\n";
    return 2;
  }
  benchmark::RunSpecifiedBenchmarks();
  return 0;
}
