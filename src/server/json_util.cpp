// Request-body JSON parsing and typed field access for the HTTP routes.
#include "server/json_util.h"

#include <cmath>

#include "engine/sampling_params.h"

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

namespace {

// True when `token` holds a \uXXXX escape in the UTF-16 surrogate range.
bool holds_surrogate_escape(std::string_view token) {
  for (size_t i = 0; i + 6 <= token.size(); ++i) {
    if (token[i] != '\\' || token[i + 1] != 'u') continue;
    unsigned v = 0;
    bool hex = true;
    for (size_t k = 2; k < 6 && hex; ++k) {
      const char c = token[i + k];
      const int d = c >= '0' && c <= '9'   ? c - '0'
                    : c >= 'a' && c <= 'f' ? c - 'a' + 10
                    : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                           : -1;
      hex = d >= 0;
      v = v * 16 + static_cast<unsigned>(d);
    }
    if (hex && v >= 0xD800 && v <= 0xDFFF) return true;
  }
  return false;
}

// nlohmann's DOM builder behind a SAX handler that bounds the nesting depth and knows the path of
// the value being read (`messages[0].content`), so that an error names the field at fault.
class BoundedParser {
 public:
  using Dom = nlohmann::detail::json_sax_dom_parser<json>;

  explicit BoundedParser(json& out) : dom_(out, /*allow_exceptions=*/false) {}

  bool null() { return value() && dom_.null(); }
  bool boolean(bool v) { return value() && dom_.boolean(v); }
  bool number_integer(json::number_integer_t v) { return value() && dom_.number_integer(v); }
  bool number_unsigned(json::number_unsigned_t v) { return value() && dom_.number_unsigned(v); }
  bool number_float(json::number_float_t v, const json::string_t& s) {
    return value() && dom_.number_float(v, s);
  }
  bool string(json::string_t& v) { return value() && dom_.string(v); }
  bool binary(json::binary_t& v) { return value() && dom_.binary(v); }
  bool start_object(std::size_t n) { return open(false) && dom_.start_object(n); }
  bool start_array(std::size_t n) { return open(true) && dom_.start_array(n); }
  bool end_object() { return close() && dom_.end_object(); }
  bool end_array() { return close() && dom_.end_array(); }
  bool key(json::string_t& k) {
    if (!frames_.empty()) frames_.back().key = k.substr(0, 64);
    return dom_.key(k);
  }
  bool parse_error(std::size_t, const std::string& last_token,
                   const nlohmann::detail::exception& ex) {
    error_id_ = ex.id;
    error_ = ex.what();
    error_path_ = path();
    surrogate_ = holds_surrogate_escape(last_token);
    return false;
  }

  // After sax_parse returned false: throws what the body did wrong.
  [[noreturn]] void fail() const {
    const std::string field = field_name();
    if (too_deep_)
      throw ValidationError(field, "`" + error_path_ + "` nests deeper than " +
                                       std::to_string(kMaxJsonDepth) +
                                       " levels of objects and arrays");
    if (error_id_ == 406)  // nlohmann's out_of_range.406: a number beyond double's range
      throw ValidationError(field, "`" + error_path_ + "` holds a number out of range");
    if (surrogate_)  // a lexer error in a string holding \uD800-\uDFFF: an unpaired half
      throw ValidationError(field,
                            "`" + error_path_ + "` holds an unpaired UTF-16 surrogate escape");
    const size_t colon = error_.find(": ");
    throw Error(
        "malformed JSON: " + (colon == std::string::npos ? error_ : error_.substr(colon + 2)),
        ErrorKind::kMalformed);
  }

 private:
  struct Frame {
    bool array = false;
    int64_t count = 0;  // elements begun so far (arrays)
    std::string key;    // the current key (objects)
  };

  bool value() {
    if (!frames_.empty() && frames_.back().array) ++frames_.back().count;
    return true;
  }
  bool open(bool array) {
    value();
    if (frames_.size() >= static_cast<size_t>(kMaxJsonDepth)) {
      too_deep_ = true;
      error_path_ = path();
      return false;
    }
    frames_.push_back({array, 0, {}});
    return true;
  }
  bool close() {
    if (!frames_.empty()) frames_.pop_back();
    return true;
  }
  // The path of the value being read, its first 8 steps.
  std::string path() const {
    std::string out;
    for (size_t i = 0; i < frames_.size() && i < 8; ++i) {
      const Frame& f = frames_[i];
      if (f.array)
        out += "[" + std::to_string(std::max<int64_t>(0, f.count - 1)) + "]";
      else if (!f.key.empty() || i > 0)
        out += (out.empty() ? "" : ".") + f.key;
    }
    if (frames_.size() > 8) out += "...";
    return out.empty() ? "body" : out;
  }
  std::string field_name() const {
    const size_t end = error_path_.find_first_of(".[");
    return error_path_.substr(0, end == 0 ? error_path_.size() : end);
  }

  Dom dom_;
  std::vector<Frame> frames_;
  bool too_deep_ = false;
  bool surrogate_ = false;
  int error_id_ = 0;
  std::string error_, error_path_;
};

}  // namespace

json parse_json_object(std::string_view body) {
  if (!valid_utf8(body)) throw ValidationError("inputs", "request body is not valid UTF-8");
  json j;
  BoundedParser parser(j);
  if (!json::sax_parse(body, &parser, json::input_format_t::json, /*strict=*/true)) parser.fail();
  if (!j.is_object()) throw Error("the request body must be a JSON object", ErrorKind::kMalformed);
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
