// The compiler and matcher against the Falcon tokenizer: masks allow exactly the tokens that
// keep the text inside the grammar, a complete grammar allows only EOS, compiles are shared
// through the cache and run off the caller's thread, bad constraints name their field.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "../test_data.h"
#include "core/error.h"
#include "grammar/constraint.h"
#include "text/tokenizer.h"

namespace kestrel::grammar {
namespace {

constexpr int32_t kEos = 11;

const text::Tokenizer& tok() {
  static const text::Tokenizer t =
      text::Tokenizer::from_model_dir(test::test_data_dir() + "/e2e-falcon7b-fullvocab");
  return t;
}

std::shared_ptr<const Compiled> wait(const std::shared_ptr<Pending>& p) {
  for (int i = 0; i < 3000 && !p->ready(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_TRUE(p->ready());
  EXPECT_EQ(p->error(), "");
  return p->grammar();
}

bool allowed(const std::vector<int32_t>& mask, int32_t id) {
  return (static_cast<uint32_t>(mask[id >> 5]) >> (id & 31)) & 1u;
}

std::vector<int32_t> mask_of(Matcher& m, int64_t words) {
  std::vector<int32_t> mask(words, 0);
  fill_bitmasks({&m}, mask.data(), words, 1);
  return mask;
}

TEST(GrammarCompiler, RegexMaskFollowsTheText) {
  Compiler c(tok(), 65024, kEos, {});
  auto g = wait(c.compile({Spec::Kind::kRegex, "ab[0-9]+", "grammar.value"}));
  Matcher m(g);
  const int64_t words = c.bitmask_words();
  std::vector<int32_t> mask = mask_of(m, words);
  // Every allowed token's text is a prefix of a match; a few checks by spelling.
  for (int32_t id = 0; id < tok().vocab_size(); ++id) {
    if (!allowed(mask, id)) continue;
    const std::string t = tok().decode(std::vector<int32_t>{id});
    ASSERT_TRUE(
        t == "a" || t == "ab" ||
        (t.rfind("ab", 0) == 0 && t.find_first_not_of("0123456789", 2) == std::string::npos))
        << "token " << id << " '" << t << "' allowed at the start";
  }
  EXPECT_FALSE(allowed(mask, kEos));
  const auto ab = tok().encode("ab", false);
  for (int32_t id : ab) ASSERT_TRUE(m.accept(id));
  const auto digits = tok().encode("12", false);
  for (int32_t id : digits) ASSERT_TRUE(m.accept(id));
  mask = mask_of(m, words);
  EXPECT_TRUE(allowed(mask, kEos));  // complete: may end
  EXPECT_FALSE(m.accept(tok().encode("x", false)[0]));
  ASSERT_TRUE(m.accept(kEos));
  EXPECT_TRUE(m.terminated());
}

TEST(GrammarCompiler, CompleteSchemaAllowsOnlyEos) {
  Compiler c(tok(), 65024, kEos, {});
  auto g = wait(c.compile({Spec::Kind::kJsonSchema, R"({"enum": ["yes", "no"]})", "schema"}));
  Matcher m(g);
  for (int32_t id : tok().encode("\"yes\"", false)) ASSERT_TRUE(m.accept(id));
  const std::vector<int32_t> mask = mask_of(m, c.bitmask_words());
  int n = 0;
  for (int32_t id = 0; id < 65024; ++id) n += allowed(mask, id);
  EXPECT_EQ(n, 1);
  EXPECT_TRUE(allowed(mask, kEos));
  // A fork continues on its own.
  Matcher f = m.fork();
  ASSERT_TRUE(f.accept(kEos));
  EXPECT_TRUE(f.terminated());
  EXPECT_FALSE(m.terminated());
}

TEST(GrammarCompiler, SpecialTokensAndPaddingAreNeverAllowed) {
  // Logits wider than the tokenizer (padded vocabularies): the padding is masked too.
  Compiler c(tok(), 65024 + 64, kEos, {});
  auto g = wait(c.compile({Spec::Kind::kJsonObject, "", "response_format"}));
  Matcher m(g);
  const std::vector<int32_t> mask = mask_of(m, c.bitmask_words());
  for (int32_t id = 65024; id < 65024 + 64; ++id) EXPECT_FALSE(allowed(mask, id)) << id;
  for (int32_t id = 0; id < 11; ++id) EXPECT_FALSE(allowed(mask, id)) << id;  // >>TITLE<< ...
  EXPECT_TRUE(allowed(mask, tok().encode("{", false)[0]));
}

TEST(GrammarCompiler, CacheSharesCompilesOfTheSameSchema) {
  Compiler c(tok(), 65024, kEos, {});
  auto a = c.compile({Spec::Kind::kJsonSchema, R"({"type":"integer","minimum":1})", "s"});
  auto b = c.compile({Spec::Kind::kJsonSchema, R"({ "type": "integer",  "minimum": 1 })", "s"});
  wait(a);
  wait(b);
  EXPECT_EQ(a->grammar(), b->grammar());
  CompilerStats st = c.stats();
  EXPECT_EQ(st.compiles, 1);
  EXPECT_EQ(st.cache_hits, 1);
  ASSERT_EQ(st.recent_seconds.size(), 1u);
  EXPECT_GT(st.recent_seconds[0], 0.0);
  // Key order is meaning (the order of properties in the output): another compile.
  wait(c.compile({Spec::Kind::kJsonSchema, R"({"minimum":1,"type":"integer"})", "s"}));
  EXPECT_EQ(c.stats().compiles, 2);
}

TEST(GrammarCompiler, PropertiesComeInTheSchemasOrder) {
  Compiler c(tok(), 65024, kEos, {});
  auto g = wait(c.compile({Spec::Kind::kJsonSchema,
                           R"({"type":"object","properties":{"zeta":{"type":"boolean"},)"
                           R"("alpha":{"type":"boolean"}},"required":["zeta","alpha"]})",
                           "s"}));
  Matcher m(g);
  for (int32_t id : tok().encode("{\"zeta\": true, \"alpha\": false}", false)) {
    ASSERT_TRUE(m.accept(id));
  }
  Matcher sorted(g);
  bool ok = true;
  for (int32_t id : tok().encode("{\"alpha\": false", false)) ok = ok && sorted.accept(id);
  EXPECT_FALSE(ok);
}

TEST(GrammarCompiler, CacheIsBounded) {
  Compiler c(tok(), 65024, kEos, {1, 2});
  for (int i = 0; i < 4; ++i) {
    wait(c.compile({Spec::Kind::kRegex, "x{" + std::to_string(i + 1) + "}", "r"}));
  }
  wait(c.compile({Spec::Kind::kRegex, "x{1}", "r"}));  // evicted: compiled again
  EXPECT_EQ(c.stats().compiles, 5);
}

TEST(GrammarCompiler, CacheIsBoundedInBytes) {
  Compiler c(tok(), 65024, kEos, {1, 512, 1});  // room for the newest compile only
  wait(c.compile({Spec::Kind::kRegex, "a+", "r"}));
  const int64_t one = c.stats().cached_bytes;
  EXPECT_GT(one, 0);
  wait(c.compile({Spec::Kind::kRegex, "b+", "r"}));
  wait(c.compile({Spec::Kind::kRegex, "a+", "r"}));  // evicted by b+: compiled again
  EXPECT_EQ(c.stats().compiles, 3);
  EXPECT_EQ(c.stats().cached_bytes, one);  // a+ alone
}

TEST(GrammarCompiler, OnReadyRunsOffTheCallersThread) {
  Compiler c(tok(), 65024, kEos, {});
  std::atomic<bool> called{false};
  std::thread::id where;
  std::mutex mu;
  c.set_on_ready([&] {
    std::lock_guard<std::mutex> lock(mu);
    where = std::this_thread::get_id();
    called = true;
  });
  wait(c.compile({Spec::Kind::kJsonSchema, R"({"type":"boolean"})", "s"}));
  for (int i = 0; i < 200 && !called; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_TRUE(called);
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_NE(where, std::this_thread::get_id());
}

TEST(GrammarCompiler, InvalidConstraintsNameTheirField) {
  Compiler c(tok(), 65024, kEos, {});
  auto field_of = [&](Spec s) {
    try {
      c.compile(s);
    } catch (const ValidationError& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
      return e.field();
    }
    return std::string("accepted");
  };
  EXPECT_EQ(field_of({Spec::Kind::kRegex, "a(b", "grammar.value"}), "grammar.value");
  try {  // the message names the field and carries no log prefix of xgrammar's
    c.compile({Spec::Kind::kRegex, "a(b", "grammar.value"});
  } catch (const ValidationError& e) {
    const std::string m = e.what();
    EXPECT_EQ(m.rfind("`grammar.value` is not a valid regex: ", 0), 0u) << m;
    EXPECT_EQ(m.find(".cc:"), std::string::npos) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  }
  EXPECT_EQ(field_of({Spec::Kind::kRegex, "[z-a]", "grammar.value"}), "grammar.value");
  EXPECT_EQ(field_of({Spec::Kind::kRegex, "(?=.*[0-9])[a-z0-9]+", "grammar.value"}),
            "grammar.value");
  EXPECT_EQ(field_of({Spec::Kind::kRegex, "x(?<!y)", "grammar.value"}), "grammar.value");
  EXPECT_EQ(field_of({Spec::Kind::kJsonSchema, "[1,", "response_format.schema"}),
            "response_format.schema");
  EXPECT_EQ(field_of({Spec::Kind::kJsonSchema, R"({"type":"array","contains":{}})", "rf"}), "rf");
  EXPECT_EQ(c.stats().compiles, 0);  // refused before any compile
  // A lookaround's spelling inside a class is no lookaround (compiled off-thread: after the count).
  EXPECT_EQ(field_of({Spec::Kind::kRegex, "[(?=]+", "grammar.value"}), "accepted");
}

}  // namespace
}  // namespace kestrel::grammar
