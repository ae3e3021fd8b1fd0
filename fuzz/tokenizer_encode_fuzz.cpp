// Fuzzes the Falcon tokenizer on arbitrary bytes. Mode 0 (first byte even):
// the rest is text; invalid UTF-8 must give kestrel::Error, valid text must
// round-trip through encode/decode and the streaming detokenizer. Mode 1: the
// rest is token ids; streaming must equal decode and emit only valid UTF-8.
// Falcon's vocabulary lacks 28 of the 256 byte tokens (e.g. 0x04, 0xF2): BPE
// drops those bytes, as HF does, so the round trip is checked without them.
#include <array>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/error.h"
#include "text/tokenizer.h"
#include "text/unicode.h"

using kestrel::text::IncrementalDetokenizer;
using kestrel::text::Tokenizer;

namespace {

const Tokenizer& falcon() {
  static const Tokenizer tok = Tokenizer::from_file(KESTREL_FUZZ_TOKENIZER);
  return tok;
}

// The text decode(encode(text)) gives: text less the bytes with no token.
std::string expected_round_trip(const std::string& text) {
  static const std::array<bool, 256> missing = [] {
    std::array<bool, 256> m{};
    for (int b = 0; b < 256; ++b) {
      std::string c;
      kestrel::text::append_utf8(kestrel::text::byte_to_unicode()[b], c);
      m[b] = !falcon().token_id(c).has_value();
    }
    return m;
  }();
  std::string kept;
  for (char ch : text)
    if (!missing[static_cast<unsigned char>(ch)]) kept.push_back(ch);
  return kestrel::text::utf8_lossy(kept);
}

void require(bool ok) {
  if (!ok) __builtin_trap();
}

std::string stream(const std::vector<int32_t>& ids, bool skip_special) {
  IncrementalDetokenizer detok(falcon(), {}, skip_special);
  std::string all;
  for (int32_t id : ids) {
    const std::string chunk = detok.push(id);
    require(kestrel::text::is_valid_utf8(chunk));
    all += chunk;
  }
  return all + detok.flush();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const bool ids_mode = data[0] & 1;
  const bool skip_special = data[0] & 2;
  const std::string rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (!ids_mode) {
    std::vector<int32_t> ids;
    try {
      ids = falcon().encode(rest, true);
    } catch (const kestrel::Error&) {
      require(!kestrel::text::is_valid_utf8(rest));
      return 0;
    }
    require(kestrel::text::is_valid_utf8(rest));
    const std::string expected = expected_round_trip(rest);
    require(falcon().decode(ids) == expected);
    require(stream(ids, false) == expected);
    return 0;
  }
  std::vector<int32_t> ids;
  for (size_t i = 0; i + 1 < rest.size(); i += 2) {
    // Mostly real ids, some past the vocabulary.
    ids.push_back((uint8_t(rest[i]) | (uint8_t(rest[i + 1]) << 8)) % 65100);
  }
  const std::string full = falcon().decode(ids, skip_special);
  require(kestrel::text::is_valid_utf8(full));
  require(stream(ids, skip_special) == full);
  return 0;
}
