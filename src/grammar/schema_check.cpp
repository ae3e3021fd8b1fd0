// Walks a JSON Schema the way xgrammar 0.2.8's SchemaParser reads it (json_schema_converter.cc) and
// refuses what it would drop. The rules are listed in schema_check.h.
#include "grammar/schema_check.h"

#include <cstring>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <vector>

namespace kestrel::grammar {
namespace {

using nlohmann::json;

constexpr int kMaxDepth = 64;
constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

// JSON types as a bit set.
constexpr unsigned kNull = 1, kBoolean = 2, kObject = 4, kArray = 8, kNumber = 16, kInteger = 32,
                   kString = 64, kNumeric = kNumber | kInteger;

// The types a keyword applies to: 0 for annotations, which any schema may hold, and ~0u for the
// keywords xgrammar never reads (not, uniqueItems, ...) or does not know.
unsigned keyword_types(const std::string& k) {
  using Words = std::set<std::string>;
  static const std::vector<std::pair<unsigned, Words>> kWords = {
      {0, Words{"title", "description", "default", "examples", "$comment", "$schema", "deprecated",
                "readOnly", "writeOnly", "$id", "$defs", "definitions"}},
      {kNumeric, Words{"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"}},
      {kString, Words{"minLength", "maxLength", "pattern", "format"}},
      {kArray, Words{"items", "prefixItems", "unevaluatedItems", "minItems", "maxItems"}},
      {kObject,
       Words{"properties", "required", "patternProperties", "propertyNames", "additionalProperties",
             "unevaluatedProperties", "minProperties", "maxProperties"}}};
  for (const auto& [types, words] : kWords)
    if (words.count(k)) return types;
  return ~0u;
}

// A `type` value as a bit set; 0 when it is not a type name or a non-empty array of them.
unsigned type_mask(const json& type) {
  static const std::map<std::string, unsigned> kNames = {
      {"null", kNull},     {"boolean", kBoolean}, {"object", kObject}, {"array", kArray},
      {"number", kNumber}, {"integer", kInteger}, {"string", kString}};
  unsigned mask = 0;
  for (const auto& name : type.is_array() ? type : json::array({type})) {
    if (!name.is_string() || !kNames.count(name.get<std::string>())) return 0;
    mask |= kNames.at(name.get<std::string>());
  }
  return mask;
}

bool is_int64(const json& v) {
  return v.is_number_integer() &&
         (!v.is_number_unsigned() || v.get<uint64_t>() <= uint64_t{INT64_MAX});
}

// Whether `v` is a value of one of `types` (1.0 is an integer, as in JSON Schema).
bool has_type(const json& v, unsigned types) {
  if (v.is_number())
    return (types & kNumber) ||
           ((types & kInteger) && std::floor(v.get<double>()) == v.get<double>());
  return types & (v.is_null()      ? kNull
                  : v.is_boolean() ? kBoolean
                  : v.is_string()  ? kString
                  : v.is_array()   ? kArray
                                   : kObject);
}

// ---- oneOf: which oneOfs xgrammar proves exclusive (TryProvePairwiseDisjointOneOf). ----

// xgrammar's JSONValuesMayOverlap, more cautious about arrays and objects: two numbers differ only
// when both are int64.
bool may_overlap(const json& a, const json& b) {
  if (a.is_number() || b.is_number())
    return a.is_number() && b.is_number() &&
           (!is_int64(a) || !is_int64(b) || a.get<int64_t>() == b.get<int64_t>());
  return a.type() == b.type() && (a.is_structured() || a == b);
}

// A oneOf branch as ClassifyTypeOrFiniteOneOfArm sees it: the values of a const or an enum, or a
// set of non-object types (types != 0).
struct Arm {
  std::vector<json> values;
  unsigned types = 0;
};

// nullopt for a branch with anything else than const, enum, or `type` and xgrammar's annotations
// (ours less $id and $defs). The branches were checked before: an enum is a non-empty array.
std::optional<Arm> classify(const json& s) {
  if (!s.is_object() || s.contains("$ref") || s.contains("anyOf") || s.contains("allOf") ||
      s.contains("oneOf"))
    return std::nullopt;
  if (s.contains("const")) return Arm{{s["const"]}};
  if (s.contains("enum")) return Arm{s["enum"].get<std::vector<json>>()};
  for (const auto& [k, v] : s.items())
    if (k != "type" && (keyword_types(k) != 0 || k == "$id" || k == "$defs" || k == "definitions"))
      return std::nullopt;
  const unsigned types = s.contains("type") ? type_mask(s["type"]) : 0;
  if (!types || (types & kObject)) return std::nullopt;
  return Arm{{}, types};
}

bool disjoint(const Arm& a, const Arm& b) {
  if (a.types && b.types)
    return !(a.types & b.types) && !(a.types & kNumeric && b.types & kNumeric);
  if (a.types) return disjoint(b, a);
  for (const auto& x : a.values) {
    if (x.is_number() ? (b.types & kNumeric) != 0 : has_type(x, b.types)) return false;
    for (const auto& y : b.values)
      if (may_overlap(x, y)) return false;
  }
  return true;
}

// xgrammar also proves a oneOf of objects that all require one property with disjoint const/enum
// values; that proof is left out, and such a oneOf refused: `anyOf` says the same of exclusive
// branches and is accepted.
bool oneof_is_exclusive(const json& options) {
  std::vector<Arm> arms;
  for (const auto& option : options) {
    auto arm = classify(option);
    if (!arm) return false;
    for (const auto& other : arms)
      if (!disjoint(other, *arm)) return false;
    arms.push_back(std::move(*arm));
  }
  return true;
}

// ---- The walk. ----

std::string escape(const std::string& token) {
  std::string out;
  for (char c : token) out += c == '~' ? "~0" : c == '/' ? "~1" : std::string(1, c);
  return out;
}

class Checker {
 public:
  Checker(const json& root, const std::string& field) : root_(root), field_(field) {}

  // Checks the schema `s` at JSON pointer `ptr`; `names` for a propertyNames schema, which
  // xgrammar reads as a string when it has no `type`.
  void check(const json& s, const std::string& ptr, int depth, bool names = false) {
    if (depth > kMaxDepth)
      fail("the schema at " + at(ptr) + " nests deeper than " + std::to_string(kMaxDepth) +
           " levels");
    if (!done_.insert(ptr + (names ? "\n" : "")).second) return;
    if (s == false) fail("the schema `false` at " + at(ptr) + " admits no value to generate");
    if (s == true) return;
    if (!s.is_object()) fail("the schema at " + at(ptr) + " must be an object or a boolean");
    if (s.contains("$id") && !ptr.empty())
      refuse("$id", ptr, "a nested `$id` would change what `$ref` means below it");
    for (const char* defs : {"$defs", "definitions"}) {
      if (!s.contains(defs)) continue;
      need(s[defs].is_object(), defs, ptr, "must be an object of schemas");
      for (const auto& [name, sub] : s[defs].items())
        check(sub, ptr + "/" + defs + "/" + escape(name), depth + 1);
    }
    for (const char* branch : {"$ref", "const", "enum", "anyOf", "oneOf", "allOf"})
      if (s.contains(branch)) return check_branch(s, branch, ptr, depth, names);
    unsigned types = names ? kString : 0u;
    auto has = [&](const char* a, const char* b, const char* c) {
      return !names && (s.contains(a) || s.contains(b) || s.contains(c));
    };
    if (s.contains("type")) {
      types = type_mask(s["type"]);
      need(types, "type", ptr, "must be a JSON type name or a non-empty array of them");
      need(!names || types == kString, "type", ptr, "of `propertyNames` must be \"string\"");
    } else if (has("properties", "additionalProperties", "unevaluatedProperties")) {
      types = kObject;
    } else if (has("items", "prefixItems", "unevaluatedItems")) {
      types = kArray;
    }
    for (const auto& [k, v] : s.items()) {
      if (k == "type") continue;
      if (keyword_types(k) == ~0u) refuse(k, ptr);
      if (keyword_types(k) && !types) refuse(k, ptr, "it would not be enforced without a `type`");
    }
    // A keyword of a type the value cannot have holds trivially: it is not read.
    if (types & kNumeric) check_numeric(s, ptr, types);
    if (types & kString) check_string(s, ptr);
    if (types & kArray) check_array(s, ptr, depth);
    if (types & kObject) check_object(s, ptr, depth);
  }

 private:
  [[noreturn]] void fail(const std::string& message) const {
    throw ValidationError(field_, message);
  }
  static std::string at(const std::string& ptr) { return ptr.empty() ? "the root" : ptr; }
  [[noreturn]] void refuse(const std::string& k, const std::string& ptr,
                           const std::string& why = "it would not be enforced") const {
    fail("`" + k + "` at " + at(ptr) + " is not supported by structured output (" + why + ")");
  }
  void need(bool ok, const std::string& k, const std::string& ptr, const std::string& what) const {
    if (!ok) fail("`" + k + "` at " + at(ptr) + " " + what);
  }
  // A count (minLength, maxItems, ...) as xgrammar reads it: a non-negative int64, at most `max`.
  int64_t count(const json& s, const char* k, const std::string& ptr, int64_t max = INT64_MAX) {
    if (!s.contains(k)) return -1;
    need(is_int64(s[k]) && s[k].get<int64_t>() >= 0 && s[k].get<int64_t>() <= max, k, ptr,
         "must be a non-negative integer" +
             (max < INT64_MAX ? " not above " + std::to_string(max) : std::string()));
    return s[k].get<int64_t>();
  }
  static bool is_open(const json& s, const char* k) {  // present and admitting values
    return s.contains(k) && (s[k].is_object() || s[k] == true);
  }
  void check_sub(const json& s, const char* k, const std::string& ptr, int depth) {
    need(s[k].is_boolean() || s[k].is_object(), k, ptr, "must be a schema");
    if (s[k].is_object()) check(s[k], ptr + "/" + k, depth + 1);
  }

  // $ref, const, enum, anyOf, oneOf, allOf: xgrammar reads that keyword and drops the others.
  void check_branch(const json& s, const std::string& branch, const std::string& ptr, int depth,
                    bool names) {
    const json& v = s[branch];
    const bool finite = branch == "const" || branch == "enum";
    for (const auto& [k, other] : s.items()) {
      if (k == branch || keyword_types(k) == 0 || (finite && k == "type")) continue;
      if (branch == "const" && k == "enum" && other.is_array() &&
          std::find(other.begin(), other.end(), v) != other.end())
        continue;
      refuse(k, ptr, "it would not be enforced next to `" + branch + "`");
    }
    if (finite) {
      need(branch == "const" || (v.is_array() && !v.empty()), branch, ptr,
           "must be a non-empty array");
      const unsigned types = s.contains("type") ? type_mask(s["type"]) : ~0u;
      need(types, "type", ptr, "must be a JSON type name or a non-empty array of them");
      for (const auto& value : branch == "const" ? json::array({v}) : v) {
        need(has_type(value, types), branch, ptr, "holds a value that `type` does not allow");
        need(!names || value.is_string(), branch, ptr,
             "holds a property name that is not a string");
      }
      return;
    }
    need(!names, branch, ptr, "cannot describe property names; use `pattern` or `enum`");
    if (branch == "$ref") return check_ref(v, ptr, depth);
    need(v.is_array() && !v.empty(), branch, ptr, "must be a non-empty array of schemas");
    for (size_t i = 0; i < v.size(); ++i)
      check(v[i], ptr + "/" + branch + "/" + std::to_string(i), depth + 1);
    if (branch == "allOf" && v.size() > 1)
      refuse(branch, ptr, "with several members it would let any value through");
    if (branch == "oneOf" && !oneof_is_exclusive(v))
      refuse(branch, ptr,
             "its branches are not provably exclusive, so it would be read as `anyOf`");
  }

  // The target of a $ref as xgrammar's ResolveRef finds it: "#", or "#/a/b" through object keys.
  const json& resolve(const json& ref, const std::string& ptr) {
    need(ref.is_string(), "$ref", ptr, "must be a string");
    const auto uri = ref.get<std::string>();
    if (uri != "#" && uri.rfind("#/", 0) != 0)
      refuse("$ref", ptr, "\"" + uri + "\" points outside this schema");
    if (uri.find_first_of("~%") != std::string::npos)
      refuse("$ref", ptr, "the escapes in \"" + uri + "\" would not be decoded");
    const json* target = &root_;
    for (size_t i = 1, end; i < uri.size(); i = end) {
      end = std::min(uri.find('/', i + 1), uri.size());
      const std::string key = uri.substr(i + 1, end - i - 1);
      if (key.empty() || !target->is_object() || !target->contains(key))
        fail("`$ref` at " + at(ptr) + " does not resolve inside the schema: \"" + uri + "\"");
      target = &(*target)[key];
    }
    return *target;
  }

  void check_ref(const json& ref, const std::string& ptr, int depth) {
    const json* target = &resolve(ref, ptr);
    check(*target, ref.get<std::string>().substr(1), depth + 1);
    // A chain of bare $refs that comes back to itself describes no value at all.
    for (int hops = 0; target->is_object() && target->contains("$ref"); ++hops) {
      need(hops < kMaxDepth, "$ref", ptr, "loops back to itself without describing a value");
      target = &resolve((*target)["$ref"], ptr);
    }
  }

  void check_numeric(const json& s, const std::string& ptr, unsigned types) {
    const char* lower = s.contains("exclusiveMinimum") ? "exclusiveMinimum" : "minimum";
    for (const char* k : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}) {
      if (!s.contains(k)) continue;
      need(s[k].is_number(), k, ptr, "must be a number");
      const double d = s[k].get<double>();  // ParseInteger: a whole number inside int64
      need(!(types & kInteger) || is_int64(s[k]) ||
               (s[k].is_number_float() && d == std::floor(d) && std::fabs(d) < 0x1p63),
           k, ptr, "must be a whole number within 64 bits for an integer");
    }
    if (s.contains("multipleOf")) {
      const json& m = s["multipleOf"];
      need(m.is_number() && m.get<double>() > 0, "multipleOf", ptr, "must be a number above 0");
      if (types & kNumber) refuse("multipleOf", ptr, "it would not be enforced for a number");
    }
    if (types & kInteger) {
      // ComputeEffectiveIntegerRange; ParseInteger refuses an exclusive bound at int64's edge.
      auto get = [&](const char* k, int64_t none) {
        return !s.contains(k)   ? none
               : is_int64(s[k]) ? s[k].get<int64_t>()
                                : static_cast<int64_t>(s[k].get<double>());
      };
      const bool has_xlo = s.contains("exclusiveMinimum"), has_xhi = s.contains("exclusiveMaximum");
      const int64_t xlo = get("exclusiveMinimum", 0), xhi = get("exclusiveMaximum", 0);
      const bool edge = (has_xlo && xlo == INT64_MAX) || (has_xhi && xhi == INT64_MIN);
      const int64_t lo =
          std::max(get("minimum", INT64_MIN), has_xlo && !edge ? xlo + 1 : INT64_MIN);
      const int64_t hi =
          std::min(get("maximum", INT64_MAX), has_xhi && !edge ? xhi - 1 : INT64_MAX);
      need(!edge && lo <= hi, lower, ptr, "is above the upper bound: no integer fits");
      if (s.contains("multipleOf")) check_multiple_of(s, ptr, lo, hi);
    }
    if (types & kNumber) {
      // GenerateNumber keeps the stricter bound of each side and writes a bounded number with at
      // most 6 decimals, so a range between two multiples of 1e-6 matches nothing.
      double lo = -HUGE_VAL, hi = HUGE_VAL;
      bool lo_ex = false, hi_ex = false;
      if (s.contains("minimum")) lo = s["minimum"].get<double>();
      if (s.contains("maximum")) hi = s["maximum"].get<double>();
      if (s.contains("exclusiveMinimum") && s["exclusiveMinimum"].get<double>() >= lo)
        lo = s["exclusiveMinimum"].get<double>(), lo_ex = true;
      if (s.contains("exclusiveMaximum") && s["exclusiveMaximum"].get<double>() <= hi)
        hi = s["exclusiveMaximum"].get<double>(), hi_ex = true;
      bool empty = lo > hi || (lo == hi && (lo_ex || hi_ex));
      if (!empty && std::fabs(lo) < 1e12 && std::fabs(hi) < 1e12) {
        const double a = lo * 1e6, b = hi * 1e6;
        const bool a_on = std::fabs(a - std::round(a)) < 1e-3,
                   b_on = std::fabs(b - std::round(b)) < 1e-3;
        empty = (a_on ? std::round(a) + lo_ex : std::ceil(a)) >
                (b_on ? std::round(b) - hi_ex : std::floor(b));
      }
      need(!empty, lower, ptr, "leaves no number of at most 6 decimals below the upper bound");
    }
  }

  // GenerateInteger enumerates the multiples in a range with both bounds, or runs a modulo
  // automaton without bounds; ParseInteger drops every other multipleOf.
  void check_multiple_of(const json& s, const std::string& ptr, int64_t lo, int64_t hi) {
    const double d = s["multipleOf"].get<double>();
    if (d != std::floor(d) || d > 1024)
      refuse("multipleOf", ptr, "only whole numbers up to 1024 are enforced");
    const bool has_lo = s.contains("minimum") || s.contains("exclusiveMinimum");
    const bool has_hi = s.contains("maximum") || s.contains("exclusiveMaximum");
    if (!has_lo && !has_hi) return;
    if (!has_lo || !has_hi || static_cast<double>(hi) - static_cast<double>(lo) >= 10000)
      refuse("multipleOf", ptr, "with bounds it is enforced only within a range of 10000 values");
    bool any = false;
    for (int64_t v = lo; !any; ++v) {
      any = v % static_cast<int64_t>(d) == 0;
      if (v == hi) break;
    }
    need(any, "multipleOf", ptr, "has no multiple between the bounds");
  }

  void check_string(const json& s, const std::string& ptr) {
    for (const char* k : {"pattern", "format"})
      if (s.contains(k)) need(s[k].is_string(), k, ptr, "must be a string");
    if (s.contains("pattern") && has_lookaround(s["pattern"].get<std::string>()))
      refuse("pattern", ptr, "its lookaround would not be enforced");
    const int64_t min = count(s, "minLength", ptr, kInt32Max);
    const int64_t max = count(s, "maxLength", ptr);
    if (s.contains("format")) {
      static const std::set<std::string> kBuiltin = {
          "email", "date",     "time", "date-time", "duration",      "ipv4",
          "ipv6",  "hostname", "uuid", "uri",       "uri-reference", "uri-template"};
      const auto format = s["format"].get<std::string>();
      if (format == "json-pointer" || format == "relative-json-pointer")
        refuse("format", ptr, "the grammar for \"" + format + "\" can write invalid JSON");
      // xgrammar's grammars for these are looser than the formats: any month has a 31st (and
      // February a 29th every year), an IPv4 byte may have leading zeros.
      if (format == "date" || format == "date-time")
        refuse("format", ptr, "the grammar for \"" + format + "\" allows dates such as 02-31");
      if (format == "ipv4")
        refuse("format", ptr, "the grammar for \"ipv4\" allows leading zeros (010.0.0.1)");
      if (!kBuiltin.count(format))
        refuse("format", ptr, "\"" + format + "\" would not be enforced");
      if (s.contains("pattern"))
        refuse("pattern", ptr, "it would not be enforced next to `format`");
    }
    for (const char* k : {"minLength", "maxLength"})
      for (const char* shadow : {"pattern", "format"})
        if (s.contains(k) && s.contains(shadow))
          refuse(k, ptr, std::string("it would not be enforced next to `") + shadow + "`");
    need(max < 0 || min <= max, "minLength", ptr, "is above `maxLength`");
  }

  void check_array(const json& s, const std::string& ptr, int depth) {
    size_t n_prefix = 0;
    if (s.contains("prefixItems")) {
      const json& prefix = s["prefixItems"];
      need(prefix.is_array(), "prefixItems", ptr, "must be an array of object schemas");
      for (size_t i = 0; i < prefix.size(); ++i) {
        need(prefix[i].is_object(), "prefixItems", ptr, "must be an array of object schemas");
        check(prefix[i], ptr + "/prefixItems/" + std::to_string(i), depth + 1);
      }
      n_prefix = prefix.size();
    }
    if (s.contains("items") && s["items"].is_array())
      fail("`items` at " + at(ptr) + " must be a schema (use `prefixItems` for a tuple)");
    for (const char* k : {"items", "unevaluatedItems"})
      if (s.contains(k)) check_sub(s, k, ptr, depth);
    const int64_t min = count(s, "minItems", ptr, kInt32Max);
    const int64_t max = count(s, "maxItems", ptr);
    need(max < 0 || min <= max, "minItems", ptr, "is above `maxItems`");
    need(max < 0 || static_cast<size_t>(max) >= n_prefix, "maxItems", ptr,
         "is below the number of `prefixItems`");
    const bool more = s.contains("items") ? is_open(s, "items") : is_open(s, "unevaluatedItems");
    need(more || min <= static_cast<int64_t>(n_prefix), "minItems", ptr,
         "asks for more items than `prefixItems` describes, and `items` allows no others");
  }

  void check_object(const json& s, const std::string& ptr, int depth) {
    static const json kNone = json::object();
    const json& props = s.contains("properties") ? s["properties"] : kNone;
    need(props.is_object(), "properties", ptr, "must be an object of schemas");
    for (const auto& [name, sub] : props.items())
      check(sub, ptr + "/properties/" + escape(name), depth + 1);
    const json required = s.value("required", json::array());
    need(required.is_array(), "required", ptr, "must be an array of strings");
    for (const auto& name : required) {
      need(name.is_string(), "required", ptr, "must be an array of strings");
      if (!props.contains(name.get<std::string>()))
        refuse("required", ptr,
               "it names \"" + name.get<std::string>() +
                   "\", which is not in `properties`, and would not be enforced");
    }
    if (s.contains("patternProperties")) {
      const json& patterns = s["patternProperties"];
      need(patterns.is_object(), "patternProperties", ptr, "must be an object of schemas");
      if (!props.empty())
        refuse("patternProperties", ptr, "it would not be enforced next to `properties`");
      if (patterns.size() > 1)
        refuse("patternProperties", ptr, "a key matching two patterns would meet only one");
      for (const auto& [pattern, sub] : patterns.items()) {
        if (has_lookaround(pattern))
          refuse("patternProperties", ptr, "the lookaround in \"" + pattern + "\" would not hold");
        check(sub, ptr + "/patternProperties/" + escape(pattern), depth + 1);
      }
    }
    const bool closed = s.contains("additionalProperties")
                            ? s["additionalProperties"] == false
                            : s.value("unevaluatedProperties", json()) == false;
    if (s.contains("propertyNames")) {
      need(s["propertyNames"].is_object(), "propertyNames", ptr, "must be an object schema");
      for (const char* other : {"properties", "patternProperties"})
        if (s.contains(other) && !s[other].empty())
          refuse("propertyNames", ptr,
                 std::string("it would not be enforced next to `") + other + "`");
      if (closed) refuse("propertyNames", ptr, "properties would be written despite `false`");
      check(s["propertyNames"], ptr + "/propertyNames", depth + 1, /*names=*/true);
    }
    for (const char* k : {"additionalProperties", "unevaluatedProperties"})
      if (s.contains(k)) check_sub(s, k, ptr, depth);
    const int64_t min = count(s, "minProperties", ptr, kInt32Max);
    const int64_t max = count(s, "maxProperties", ptr, kInt32Max);
    need(max < 0 || min <= max, "minProperties", ptr, "is above `maxProperties`");
    const auto n_required = std::set<json>(required.begin(), required.end()).size();
    need(max < 0 || static_cast<int64_t>(n_required) <= max, "maxProperties", ptr,
         "is below the number of `required` properties");
    const bool more = (s.contains("patternProperties") && !s["patternProperties"].empty()) ||
                      s.contains("propertyNames") ||
                      (s.contains("additionalProperties") ? is_open(s, "additionalProperties")
                                                          : is_open(s, "unevaluatedProperties"));
    need(more || min <= static_cast<int64_t>(props.size()), "minProperties", ptr,
         "asks for more properties than `properties` describes, and no others are allowed");
  }

  const json& root_;
  const std::string& field_;
  std::set<std::string> done_;  // pointers checked (a "\n" suffix: as property names)
};

}  // namespace

void check_json_schema(const json& schema, const std::string& field) {
  Checker(schema, field).check(schema, "", 0);
}

bool has_lookaround(const std::string& re) {
  bool in_class = false;
  for (size_t i = 0; i < re.size(); ++i) {
    if (re[i] == '\\') {
      ++i;
    } else if (in_class || re[i] == '[') {
      in_class = re[i] != ']';
    } else {
      for (const char* open : {"(?=", "(?!", "(?<=", "(?<!"}) {
        if (re.compare(i, std::strlen(open), open) == 0) return true;
      }
    }
  }
  return false;
}

}  // namespace kestrel::grammar
