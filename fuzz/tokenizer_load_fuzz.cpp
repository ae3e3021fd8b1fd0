// Fuzzes loading tokenizer.json: any input must load or throw kestrel::Error
// (never crash, hang or throw anything else); what loads must encode and
// decode a few texts.
#include <cstdint>
#include <string>
#include <string_view>

#include "core/error.h"
#include "text/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view json(reinterpret_cast<const char*>(data), size);
  try {
    const auto tok = kestrel::text::Tokenizer::from_json(json);
    for (const char* text : {"Hello world", " 123 4567 !!", "<|endoftext|>x", "日本 🦅", ""}) {
      const auto ids = tok.encode(text);
      (void)tok.decode(ids);
      (void)tok.decode(ids, true);
    }
    (void)tok.vocab_size();
  } catch (const kestrel::Error&) {
  }
  return 0;
}
