// IncrementalDetokenizer: TGI's scheme. The text of ids[prefix, read) was
// emitted already; decoding ids[prefix, end) and cutting that text off gives
// the new text, which is emitted once it grows and does not end in U+FFFD
// (an incomplete UTF-8 sequence that a later token may finish).
#include <algorithm>

#include "text/tokenizer.h"
#include "text/unicode.h"

namespace kestrel::text {

namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";
// Ids of context kept before prefix_offset, at most, before the front is dropped.
constexpr size_t kKeepIds = 64;

// Length of the common prefix of a and b, cut back to a UTF-8 boundary.
size_t common_prefix(std::string_view a, std::string_view b) {
  size_t n = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
  while (n > 0 && n < b.size() && (static_cast<unsigned char>(b[n]) & 0xC0) == 0x80) --n;
  return n;
}

}  // namespace

IncrementalDetokenizer::IncrementalDetokenizer(const Tokenizer& tokenizer,
                                               std::vector<int32_t> prompt_ids, bool skip_special)
    : tokenizer_(tokenizer), ids_(std::move(prompt_ids)), skip_special_(skip_special) {
  read_offset_ = ids_.size();
  prefix_offset_ = read_offset_ > 5 ? read_offset_ - 5 : 0;
}

std::string IncrementalDetokenizer::push(int32_t id) {
  ids_.push_back(id);
  const std::span<const int32_t> all(ids_);
  const std::string prefix_text =
      tokenizer_.decode(all.subspan(prefix_offset_, read_offset_ - prefix_offset_), skip_special_);
  const std::string new_text = tokenizer_.decode(all.subspan(prefix_offset_), skip_special_);
  const bool grown = new_text.size() > prefix_text.size() &&
                     new_text.compare(0, prefix_text.size(), prefix_text) == 0;
  if (!grown || std::string_view(new_text).ends_with(kReplacement)) return "";
  prefix_offset_ = read_offset_;
  read_offset_ = ids_.size();
  if (prefix_offset_ > kKeepIds) {
    ids_.erase(ids_.begin(), ids_.begin() + static_cast<std::ptrdiff_t>(prefix_offset_));
    read_offset_ -= prefix_offset_;
    prefix_offset_ = 0;
  }
  return new_text.substr(prefix_text.size());
}

std::string IncrementalDetokenizer::flush() {
  if (read_offset_ == ids_.size()) return "";
  const std::span<const int32_t> all(ids_);
  const std::string prefix_text =
      tokenizer_.decode(all.subspan(prefix_offset_, read_offset_ - prefix_offset_), skip_special_);
  const std::string new_text = tokenizer_.decode(all.subspan(prefix_offset_), skip_special_);
  const size_t cut = new_text.compare(0, prefix_text.size(), prefix_text) == 0
                         ? prefix_text.size()
                         : common_prefix(prefix_text, new_text);
  prefix_offset_ = read_offset_;
  read_offset_ = ids_.size();
  return new_text.substr(std::min(cut, new_text.size()));
}

}  // namespace kestrel::text
