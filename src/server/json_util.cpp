// Request-body JSON parsing and typed field access for the HTTP routes.
#include "server/json_util.h"

#include <cmath>

#include "engine/sampling_params.h"
#include "server/http_error.h"

namespace kestrel::server {

bool valid_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    const unsigned char c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    int len = 0;
    uint32_t cp = 0;
    if ((c & 0xE0) == 0xC0) {
      len = 2;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (i + len > n) return false;
    for (int k = 1; k < len; ++k) {
      if ((p[i + k] & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (p[i + k] & 0x3F);
    }
    static constexpr uint32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += len;
  }
  return true;
}

json parse_json_object(std::string_view body) {
  if (!valid_utf8(body)) throw ValidationError("inputs", "request body is not valid UTF-8");
  json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    // Tell a lone \uDC00-style surrogate (text the model cannot take) from broken syntax.
    try {
      const json strict = json::parse(body);
      (void)strict;
    } catch (const json::parse_error& e) {
      const std::string what = e.what();
      if (what.find("surrogate") != std::string::npos)
        throw ValidationError("inputs", "request body holds an unpaired UTF-16 surrogate escape");
      throw HttpError(400, "bad_request", "malformed JSON: " + what.substr(what.find(':') + 2));
    }
    throw HttpError(400, "bad_request", "malformed JSON");
  }
  if (!j.is_object()) throw HttpError(400, "bad_request", "the request body must be a JSON object");
  return j;
}

namespace {
const json* field_of(const json& obj, const char* field) {
  auto it = obj.find(field);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}
[[noreturn]] void wrong_type(const char* field, const char* want, const json& v) {
  throw ValidationError(field, std::string("`") + field + "` must be " + want + ", got " +
                                   std::string(v.type_name()));
}
}  // namespace

std::optional<bool> opt_bool(const json& obj, const char* field) {
  const json* v = field_of(obj, field);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) wrong_type(field, "a boolean", *v);
  return v->get<bool>();
}

std::optional<double> opt_number(const json& obj, const char* field) {
  const json* v = field_of(obj, field);
  if (!v) return std::nullopt;
  if (!v->is_number()) wrong_type(field, "a number", *v);
  return v->get<double>();
}

std::optional<int64_t> opt_int(const json& obj, const char* field) {
  const json* v = field_of(obj, field);
  if (!v) return std::nullopt;
  if (v->is_number_float()) {
    const double d = v->get<double>();
    if (std::floor(d) != d || std::fabs(d) > 9.0e18) wrong_type(field, "an integer", *v);
    return static_cast<int64_t>(d);
  }
  if (v->is_number_unsigned()) {
    if (v->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
      throw ValidationError(field, std::string("`") + field + "` is out of range");
    return static_cast<int64_t>(v->get<uint64_t>());
  }
  if (!v->is_number_integer()) wrong_type(field, "an integer", *v);
  return v->get<int64_t>();
}

std::optional<std::string> opt_string(const json& obj, const char* field) {
  const json* v = field_of(obj, field);
  if (!v) return std::nullopt;
  if (!v->is_string()) wrong_type(field, "a string", *v);
  return v->get<std::string>();
}

std::vector<std::string> opt_string_list(const json& obj, const char* field) {
  const json* v = field_of(obj, field);
  if (!v) return {};
  if (v->is_string()) return {v->get<std::string>()};
  if (!v->is_array()) wrong_type(field, "a string or an array of strings", *v);
  std::vector<std::string> out;
  for (const json& s : *v) {
    if (!s.is_string()) wrong_type(field, "an array of strings", s);
    out.push_back(s.get<std::string>());
  }
  return out;
}

json float_or_null(float v) {
  return std::isfinite(v) ? json(v) : json(nullptr);
}

}  // namespace kestrel::server
