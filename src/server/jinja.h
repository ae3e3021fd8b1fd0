// A Jinja subset, enough for Hugging Face chat templates (Falcon's among
// them): text, {{ expr }}, {% if/elif/else %}, {% for x in xs %} with `loop`,
// {% set %}, whitespace control (-), trim_blocks and lstrip_blocks as
// transformers sets them; expressions with literals, attribute and item access,
// slices, and/or/not, comparisons, in, is (defined, none, string, ...), + ~ * /
// %, inline if, filters (trim, length, upper, lower, default, join, first,
// last, tojson) and string methods (strip, upper, lower, startswith, ...).
//
// The types that the parser (jinja_parse.cpp) and the evaluator (jinja_eval.cpp) share, and the
// two entry points ChatTemplate (chat_template.cpp) uses.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace kestrel::server::jinja {

// ---- values ---------------------------------------------------------------

struct Value;
using List = std::vector<Value>;
using Dict = std::vector<std::pair<std::string, Value>>;

struct Value {
  enum Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict } kind = kUndefined;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;
  std::shared_ptr<List> list;
  std::shared_ptr<Dict> dict;
  bool ns = false;  // a namespace(): a dict whose attributes `set` may assign (shared, not copied)

  static Value none() { return make(kNone); }
  static Value boolean(bool v) {
    Value x = make(kBool);
    x.b = v;
    return x;
  }
  static Value integer(int64_t v) {
    Value x = make(kInt);
    x.i = v;
    return x;
  }
  static Value real(double v) {
    Value x = make(kFloat);
    x.f = v;
    return x;
  }
  static Value str(std::string v) {
    Value x = make(kString);
    x.s = std::move(v);
    return x;
  }
  static Value of_list(List v) {
    Value x = make(kList);
    x.list = std::make_shared<List>(std::move(v));
    return x;
  }
  static Value of_dict(Dict v) {
    Value x = make(kDict);
    x.dict = std::make_shared<Dict>(std::move(v));
    return x;
  }
  static Value make(Kind k) {
    Value x;
    x.kind = k;
    return x;
  }

  bool truthy() const {
    switch (kind) {
      case kUndefined:
      case kNone:
        return false;
      case kBool:
        return b;
      case kInt:
        return i != 0;
      case kFloat:
        return f != 0;
      case kString:
        return !s.empty();
      case kList:
        return !list->empty();
      case kDict:
        return !dict->empty();
    }
    return false;
  }
  bool numeric() const { return kind == kInt || kind == kFloat || kind == kBool; }
  double num() const { return kind == kFloat ? f : kind == kBool ? b : static_cast<double>(i); }
  const Value* get(const std::string& key) const {
    if (kind != kDict) return nullptr;
    for (const auto& [k, v] : *dict)
      if (k == key) return &v;
    return nullptr;
  }
};

// Throws ValidationError("messages", "chat template: " + msg).
[[noreturn]] void fail(const std::string& msg);

// ---- expressions ----------------------------------------------------------

struct Expr {
  enum Kind {
    kLit,
    kName,
    kAttr,
    kItem,
    kSlice,
    kCall,
    kFilter,
    kTest,
    kUnary,
    kBinary,
    kIf,
    kListLit,
    kDictLit
  } kind;
  Value lit;
  std::string name;                         // variable, attribute, filter/test name, or operator
  std::vector<std::shared_ptr<Expr>> args;  // operands
  std::vector<std::string> keywords;        // a call's argument names ("": positional)
  bool negate = false;                      // `is not`
};
using ExprPtr = std::shared_ptr<Expr>;

// ---- statements -----------------------------------------------------------

struct Node {
  enum Kind { kText, kOutput, kIf, kFor, kSet } kind;
  std::string text;  // kText
  ExprPtr expr;      // output, for's iterable, set's value
  std::vector<std::pair<ExprPtr, std::vector<Node>>> branches;  // if: (cond or null for else, body)
  std::vector<std::string> vars;  // for: loop variables; set: the name
  std::vector<Node> body;
};

// Template source to its program (the node list); fails on what it cannot parse.
std::vector<Node> parse(const std::string& source);

// Renders a program with `variables` as its globals.
std::string render(const std::vector<Node>& program, const Dict& variables);

}  // namespace kestrel::server::jinja
