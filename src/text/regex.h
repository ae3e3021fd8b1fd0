// A compiled PCRE2 pattern (UTF + UCP, JIT where available) that finds all
// matches the way HF tokenizers' Oniguruma wrapper iterates them.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kestrel::text {

class Regex {
 public:
  // Compiles `pattern`; literal = true matches it as a plain string. Throws
  // kestrel::Error naming the pattern and PCRE2's message on a syntax error.
  explicit Regex(const std::string& pattern, bool literal = false);
  ~Regex();
  Regex(Regex&&) noexcept;
  Regex& operator=(Regex&&) noexcept;

  // Appends [start, end) byte offsets of every non-overlapping match in s (which
  // must be valid UTF-8). An empty match right after the previous one is
  // skipped, as Oniguruma's find_iter does. Thread-safe.
  void find_all(std::string_view s, std::vector<std::pair<size_t, size_t>>& out) const;

  const std::string& pattern() const { return pattern_; }

 private:
  struct Impl;
  std::string pattern_;
  std::unique_ptr<Impl> impl_;
};

// Rewrites Oniguruma's Unicode \s, \S, \w, \W (HF tokenizers compiles its
// patterns with Oniguruma) into PCRE2 properties of the same meaning.
std::string onig_to_pcre2(std::string_view pattern);

}  // namespace kestrel::text
