// PCRE2 behind Regex: one compiled code shared by all threads, match data and
// a JIT stack per thread.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "text/regex.h"

#include <pcre2.h>

#include <cstdio>

#include "core/error.h"
#include "text/unicode.h"

namespace kestrel::text {
namespace {

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof buf);
  return reinterpret_cast<const char*>(buf);
}

// Per-thread scratch for matching: PCRE2 match data (only group 0 is read) and
// a JIT stack large enough for long runs of backtracking input.
struct ThreadMatchState {
  pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
  pcre2_jit_stack* stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
  pcre2_match_context* context = pcre2_match_context_create(nullptr);
  ThreadMatchState() {
    if (stack) pcre2_jit_stack_assign(context, nullptr, stack);
  }
  ~ThreadMatchState() {
    pcre2_match_context_free(context);
    pcre2_jit_stack_free(stack);
    pcre2_match_data_free(data);
  }
};

ThreadMatchState& thread_state() {
  thread_local ThreadMatchState state;
  return state;
}

}  // namespace

std::string onig_to_pcre2(std::string_view pattern) {
  // Oniguruma's \s is the White_Space property and its \w is letters, marks,
  // decimal digits and connector punctuation; PCRE2's differ (e.g. U+180E, U+0301).
  const std::string word = "\\p{L}\\p{M}\\p{Nd}\\p{Pc}";
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char e = pattern[++i];
      if (e == 's') {
        out += "\\p{White_Space}";
      } else if (e == 'S') {
        out += "\\P{White_Space}";
      } else if (e == 'w') {
        out += in_class ? word : "[" + word + "]";
      } else if (e == 'W' && !in_class) {
        out += "[^" + word + "]";
      } else if (e == 'p' &&
                 (pattern.substr(i + 1, 3) == "{L}" || pattern.substr(i + 1, 3) == "{N}")) {
        // PCRE2's tables (Unicode 14) lack the newer letters and numbers HF's have.
        const bool letter = pattern[i + 2] == 'L';
        std::string members = letter ? "\\p{L}" : "\\p{N}";
        for (const auto& r : letter ? letters_newer_than_pcre2() : numbers_newer_than_pcre2()) {
          char range[40];
          std::snprintf(range, sizeof range, "\\x{%X}-\\x{%X}", static_cast<unsigned>(r.first),
                        static_cast<unsigned>(r.last));
          members += range;
        }
        out += in_class ? members : "[" + members + "]";
        i += 3;
      } else {
        out += c;
        out += e;
      }
      continue;
    }
    if (c == '[' && !in_class) {
      in_class = true;
      out += c;
      // A ']' right after '[' or '[^' is a literal member.
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out += pattern[++i];
      continue;
    }
    if (c == ']' && in_class) in_class = false;
    out += c;
  }
  return out;
}

struct Regex::Impl {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Impl() { pcre2_code_free(code); }
};

Regex::Regex(const std::string& pattern, bool literal) : pattern_(pattern), impl_(new Impl) {
  int err = 0;
  PCRE2_SIZE err_offset = 0;
  // PCRE2_LITERAL admits no UCP; a literal needs no character classes anyway.
  const uint32_t options = literal ? PCRE2_UTF | PCRE2_LITERAL : PCRE2_UTF | PCRE2_UCP;
  const std::string source = literal ? pattern : onig_to_pcre2(pattern);
  impl_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(source.data()), source.size(), options,
                              &err, &err_offset, nullptr);
  if (!impl_->code) {
    KESTREL_FAIL("regex '", pattern, "' does not compile at offset ", err_offset, ": ",
                 pcre2_message(err));
  }
  impl_->jit = pcre2_jit_compile(impl_->code, PCRE2_JIT_COMPLETE) == 0;
}

Regex::~Regex() = default;
Regex::Regex(Regex&&) noexcept = default;
Regex& Regex::operator=(Regex&&) noexcept = default;

void Regex::find_all(std::string_view s, std::vector<std::pair<size_t, size_t>>& out) const {
  ThreadMatchState& st = thread_state();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(s.data());
  size_t from = 0;
  bool have_last = false;
  size_t last_end = 0;
  while (from <= s.size()) {
    int rc;
    if (impl_->jit) {
      rc = pcre2_jit_match(impl_->code, subject, s.size(), from, 0, st.data, st.context);
      if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
        rc = pcre2_match(impl_->code, subject, s.size(), from, PCRE2_NO_JIT | PCRE2_NO_UTF_CHECK,
                         st.data, nullptr);
      }
    } else {
      rc = pcre2_match(impl_->code, subject, s.size(), from, PCRE2_NO_UTF_CHECK, st.data, nullptr);
    }
    if (rc == PCRE2_ERROR_NOMATCH) return;
    if (rc < 0) KESTREL_FAIL("regex '", pattern_, "' failed to match: ", pcre2_message(rc));
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(st.data);
    const size_t start = ov[0], end = ov[1];
    if (start == end && have_last && last_end == end) {
      // Step over one code point, as Oniguruma's iterator does.
      if (from >= s.size()) return;
      size_t step = 1;
      while (from + step < s.size() && (static_cast<unsigned char>(s[from + step]) & 0xC0) == 0x80)
        ++step;
      from += step;
      continue;
    }
    out.emplace_back(start, end);
    have_last = true;
    last_end = end;
    from = end;
    if (start == end && from >= s.size()) return;
  }
}

}  // namespace kestrel::text
