// UTF-8 and Unicode helpers for the tokenizer: validation, code point decoding,
// the character classes HF tokenizers uses (from utf8proc), byte-level maps.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace kestrel::text {

// Throws kestrel::Error naming the first invalid byte and its offset when `s`
// is not well-formed UTF-8 (overlongs, surrogates and > U+10FFFF rejected).
void check_utf8(std::string_view s, std::string_view what = "input");

// True when `s` is well-formed UTF-8.
bool is_valid_utf8(std::string_view s);

// Decodes the code point at s[i] (s must be valid UTF-8); sets len to its byte length.
inline char32_t decode_utf8(std::string_view s, size_t i, size_t& len) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) {
    len = 1;
    return b0;
  }
  if (b0 < 0xE0) {
    len = 2;
    return (char32_t(b0 & 0x1F) << 6) | (static_cast<unsigned char>(s[i + 1]) & 0x3F);
  }
  if (b0 < 0xF0) {
    len = 3;
    return (char32_t(b0 & 0x0F) << 12) |
           (char32_t(static_cast<unsigned char>(s[i + 1]) & 0x3F) << 6) |
           (static_cast<unsigned char>(s[i + 2]) & 0x3F);
  }
  len = 4;
  return (char32_t(b0 & 0x07) << 18) |
         (char32_t(static_cast<unsigned char>(s[i + 1]) & 0x3F) << 12) |
         (char32_t(static_cast<unsigned char>(s[i + 2]) & 0x3F) << 6) |
         (static_cast<unsigned char>(s[i + 3]) & 0x3F);
}

// Appends the UTF-8 encoding of cp to out.
void append_utf8(char32_t cp, std::string& out);

// Rust's String::from_utf8_lossy: each maximal invalid subpart becomes U+FFFD.
std::string utf8_lossy(std::string_view bytes);

// Length of the longest prefix of `s` that does not end inside a UTF-8 sequence
// that could still be completed by more bytes.
size_t complete_utf8_prefix(std::string_view s);

// Character classes, as HF tokenizers defines them:
// punctuation: Rust char::is_ascii_punctuation || Unicode 8.0 category P* (HF's crate).
bool is_punctuation(char32_t cp);
// numeric: Rust char::is_numeric (categories Nd, Nl, No).
bool is_numeric(char32_t cp);
// whitespace: the Unicode White_Space property (Rust char::is_whitespace).
bool is_whitespace(char32_t cp);
// word: Rust regex \w (alphabetic, marks, decimal digits, connector punctuation, joiners).
bool is_word_char(char32_t cp);

// GPT-2's byte-level alphabet: byte -> the code point standing for it, and back.
const std::array<char32_t, 256>& byte_to_unicode();
// Returns the byte for a code point of the byte-level alphabet, or -1.
int unicode_to_byte(char32_t cp);

}  // namespace kestrel::text
