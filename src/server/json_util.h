// Request-body JSON: parsing (400 for malformed JSON, 422 for invalid UTF-8)
// and typed field access that names the field when its type is wrong (422).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace kestrel::server {

using nlohmann::json;

// True when `s` is well-formed UTF-8 (no overlongs, no surrogates).
bool valid_utf8(std::string_view s);

// The deepest nesting of objects and arrays a request body may have. Bodies are parsed without
// recursion, but copies, comparisons and dumps of a json value recurse: the bound keeps every later
// use of request JSON far from the stack's end.
inline constexpr int kMaxJsonDepth = 64;

// Parses a request body that must be a JSON object. Throws Error kMalformed (400) for malformed
// JSON or a non-object, ValidationError naming the field for invalid UTF-8, nesting beyond
// kMaxJsonDepth and numbers beyond double's range.
json parse_json_object(std::string_view body);

// Typed optional fields of `obj`: nullopt when absent or null, ValidationError
// naming `field` when present with the wrong type.
std::optional<bool> opt_bool(const json& obj, const char* field);
std::optional<double> opt_number(const json& obj, const char* field);
std::optional<int64_t> opt_int(const json& obj, const char* field);
std::optional<std::string> opt_string(const json& obj, const char* field);
// A string or an array of strings (OpenAI's `stop`, LoRAX's `stop`).
std::vector<std::string> opt_string_list(const json& obj, const char* field);

// The JSON for a float that may be NaN or infinite (null then).
json float_or_null(float v);

}  // namespace kestrel::server
