// The Jinja subset's evaluator (see jinja.h): scopes, filters, tests, methods, eval and exec.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>
#include <sstream>

#include "core/error.h"
#include "server/jinja.h"
#include "server/json_util.h"

namespace kestrel::server::jinja {
namespace {

// ---- values ---------------------------------------------------------------

json to_json(const Value& v);

std::string to_str(const Value& v) {
  switch (v.kind) {
    case Value::kUndefined:
      return "";
    case Value::kNone:
      return "None";
    case Value::kBool:
      return v.b ? "True" : "False";
    case Value::kInt:
      return std::to_string(v.i);
    case Value::kFloat: {
      std::ostringstream o;
      o << v.f;
      return o.str();
    }
    case Value::kString:
      return v.s;
    default:
      return to_json(v).dump();
  }
}

json to_json(const Value& v) {
  switch (v.kind) {
    case Value::kUndefined:
    case Value::kNone:
      return nullptr;
    case Value::kBool:
      return v.b;
    case Value::kInt:
      return v.i;
    case Value::kFloat:
      return v.f;
    case Value::kString:
      return v.s;
    case Value::kList: {
      json a = json::array();
      for (const Value& x : *v.list) a.push_back(to_json(x));
      return a;
    }
    case Value::kDict: {
      json o = json::object();
      for (const auto& [k, x] : *v.dict) o[k] = to_json(x);
      return o;
    }
  }
  return nullptr;
}

bool equal(const Value& a, const Value& b) {
  if (a.numeric() && b.numeric()) return a.num() == b.num();
  if (a.kind != b.kind)
    return (a.kind == Value::kNone || a.kind == Value::kUndefined) &&
           (b.kind == Value::kNone || b.kind == Value::kUndefined);
  if (a.kind == Value::kString) return a.s == b.s;
  if (a.kind == Value::kList) {
    if (a.list->size() != b.list->size()) return false;
    for (size_t k = 0; k < a.list->size(); ++k)
      if (!equal((*a.list)[k], (*b.list)[k])) return false;
    return true;
  }
  return a.kind == Value::kNone || a.kind == Value::kUndefined;
}

// ---- evaluation -----------------------------------------------------------

class Scope {
 public:
  Value lookup(const std::string& name) const {
    for (auto it = frames_.rbegin(); it != frames_.rend(); ++it)
      if (auto f = it->find(name); f != it->end()) return f->second;
    return Value();
  }
  void set(const std::string& name, Value v) { frames_.back()[name] = std::move(v); }
  void set_global(const std::string& name, Value v) { frames_.front()[name] = std::move(v); }
  void push() { frames_.emplace_back(); }
  void pop() { frames_.pop_back(); }

 private:
  std::vector<std::map<std::string, Value>> frames_{1};
};

Value eval(const Expr& e, Scope& scope);

std::string strip(const std::string& s, bool left, bool right) {
  const char* ws = " \t\r\n";
  size_t b = left ? s.find_first_not_of(ws) : 0;
  if (b == std::string::npos) return "";
  size_t e = right ? s.find_last_not_of(ws) + 1 : s.size();
  return s.substr(b, e - b);
}

std::string upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}
std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

Value length_of(const Value& v) {
  if (v.kind == Value::kString) return Value::integer(static_cast<int64_t>(v.s.size()));
  if (v.kind == Value::kList) return Value::integer(static_cast<int64_t>(v.list->size()));
  if (v.kind == Value::kDict) return Value::integer(static_cast<int64_t>(v.dict->size()));
  return Value::integer(0);
}

Value apply_filter(const std::string& f, const Value& v, const std::vector<Value>& args) {
  if (f == "trim") return Value::str(strip(to_str(v), true, true));
  if (f == "length" || f == "count") return length_of(v);
  if (f == "upper") return Value::str(upper(to_str(v)));
  if (f == "lower") return Value::str(lower(to_str(v)));
  if (f == "string") return Value::str(to_str(v));
  if (f == "tojson") return Value::str(to_json(v).dump());
  if (f == "default" || f == "d") return v.kind == Value::kUndefined && !args.empty() ? args[0] : v;
  if (f == "first" || f == "last") {
    if (v.kind == Value::kList && !v.list->empty())
      return f == "first" ? v.list->front() : v.list->back();
    if (v.kind == Value::kString && !v.s.empty())
      return Value::str(f == "first" ? v.s.substr(0, 1) : v.s.substr(v.s.size() - 1));
    return Value();
  }
  if (f == "join") {
    std::string sep = args.empty() ? "" : to_str(args[0]), out;
    if (v.kind == Value::kList)
      for (size_t k = 0; k < v.list->size(); ++k) out += (k ? sep : "") + to_str((*v.list)[k]);
    return Value::str(out);
  }
  if (f == "reverse" && v.kind == Value::kList) {
    List l(v.list->rbegin(), v.list->rend());
    return Value::of_list(std::move(l));
  }
  if (f == "list") return v.kind == Value::kList ? v : Value::of_list({});
  fail("filter `" + f + "` is not supported");
}

bool apply_test(const std::string& t, const Value& v, const std::vector<Value>& args) {
  if (t == "defined") return v.kind != Value::kUndefined;
  if (t == "undefined") return v.kind == Value::kUndefined;
  if (t == "none") return v.kind == Value::kNone;
  if (t == "string") return v.kind == Value::kString;
  if (t == "number") return v.kind == Value::kInt || v.kind == Value::kFloat;
  if (t == "integer") return v.kind == Value::kInt;
  if (t == "boolean") return v.kind == Value::kBool;
  if (t == "mapping") return v.kind == Value::kDict;
  if (t == "sequence" || t == "iterable")
    return v.kind == Value::kList || v.kind == Value::kString || v.kind == Value::kDict;
  if (t == "true") return v.kind == Value::kBool && v.b;
  if (t == "false") return v.kind == Value::kBool && !v.b;
  if (t == "odd") return v.kind == Value::kInt && v.i % 2 != 0;
  if (t == "even") return v.kind == Value::kInt && v.i % 2 == 0;
  if ((t == "equalto" || t == "eq") && !args.empty()) return equal(v, args[0]);
  fail("test `" + t + "` is not supported");
}

Value call_method(const Value& obj, const std::string& m, const std::vector<Value>& args) {
  if (obj.kind == Value::kString) {
    const std::string& s = obj.s;
    if (m == "strip") return Value::str(strip(s, true, true));
    if (m == "lstrip") return Value::str(strip(s, true, false));
    if (m == "rstrip") return Value::str(strip(s, false, true));
    if (m == "upper") return Value::str(upper(s));
    if (m == "lower") return Value::str(lower(s));
    if (m == "startswith" && !args.empty()) return Value::boolean(s.rfind(to_str(args[0]), 0) == 0);
    if (m == "endswith" && !args.empty()) {
      const std::string x = to_str(args[0]);
      return Value::boolean(s.size() >= x.size() &&
                            s.compare(s.size() - x.size(), x.size(), x) == 0);
    }
    if (m == "replace" && args.size() >= 2) {
      std::string out = s, from = to_str(args[0]), to = to_str(args[1]);
      if (from.empty()) return Value::str(out);
      for (size_t pos = 0; (pos = out.find(from, pos)) != std::string::npos; pos += to.size())
        out.replace(pos, from.size(), to);
      return Value::str(out);
    }
  }
  if (obj.kind == Value::kDict) {
    if (m == "get" && !args.empty()) {
      const Value* v = obj.get(to_str(args[0]));
      return v ? *v : args.size() > 1 ? args[1] : Value::none();
    }
    if (m == "items") {
      List items;
      for (const auto& [k, v] : *obj.dict) items.push_back(Value::of_list({Value::str(k), v}));
      return Value::of_list(std::move(items));
    }
    if (m == "keys") {
      List keys;
      for (const auto& kv : *obj.dict) keys.push_back(Value::str(kv.first));
      return Value::of_list(std::move(keys));
    }
  }
  fail("method `" + m + "` is not supported");
}

Value item(const Value& obj, const Value& key) {
  if (obj.kind == Value::kUndefined)  // as jinja2: reading into nothing is an error, not ""
    throw ValidationError("messages", "the chat template reads `" + to_str(key) +
                                          "` of an undefined value (of a message that is not "
                                          "there?)");
  if (obj.kind == Value::kDict) {
    const Value* v = obj.get(to_str(key));
    return v ? *v : Value();
  }
  if ((obj.kind == Value::kList || obj.kind == Value::kString) && key.kind == Value::kInt) {
    const int64_t n = obj.kind == Value::kList ? static_cast<int64_t>(obj.list->size())
                                               : static_cast<int64_t>(obj.s.size());
    int64_t k = key.i < 0 ? key.i + n : key.i;
    if (k < 0 || k >= n) return Value();
    return obj.kind == Value::kList ? (*obj.list)[k] : Value::str(obj.s.substr(k, 1));
  }
  return Value();
}

Value eval(const Expr& e, Scope& scope) {
  switch (e.kind) {
    case Expr::kLit:
      return e.lit;
    case Expr::kName:
      return scope.lookup(e.name);
    case Expr::kAttr:
      return item(eval(*e.args[0], scope), Value::str(e.name));
    case Expr::kItem:
      return item(eval(*e.args[0], scope), eval(*e.args[1], scope));
    case Expr::kSlice: {
      const Value obj = eval(*e.args[0], scope);
      const int64_t n = length_of(obj).i;
      auto bound = [&](const ExprPtr& x, int64_t dflt) {
        if (!x) return dflt;
        int64_t v = eval(*x, scope).i;
        if (v < 0) v += n;
        return std::clamp<int64_t>(v, 0, n);
      };
      const int64_t lo = bound(e.args[1], 0), hi = bound(e.args[2], n);
      if (obj.kind == Value::kList)
        return Value::of_list(hi > lo ? List(obj.list->begin() + lo, obj.list->begin() + hi)
                                      : List{});
      if (obj.kind == Value::kString) return Value::str(hi > lo ? obj.s.substr(lo, hi - lo) : "");
      return Value();
    }
    case Expr::kCall: {
      std::vector<Value> args;
      for (size_t k = 1; k < e.args.size(); ++k) args.push_back(eval(*e.args[k], scope));
      const Expr& callee = *e.args[0];
      if (callee.kind == Expr::kAttr)
        return call_method(eval(*callee.args[0], scope), callee.name, args);
      if (callee.kind == Expr::kName && callee.name == "raise_exception")
        throw ValidationError(
            "messages", args.empty() ? "the chat template refused the messages" : to_str(args[0]));
      if (callee.kind == Expr::kName && callee.name == "range" && !args.empty()) {
        List l;
        for (int64_t k = 0; k < args[0].i; ++k) l.push_back(Value::integer(k));
        return Value::of_list(std::move(l));
      }
      if (callee.kind == Expr::kName && callee.name == "namespace") {
        // namespace(a=1, ...), or namespace(dict) merged with keywords
        Dict d;
        for (size_t k = 0; k < args.size(); ++k) {
          if (!e.keywords[k].empty()) {
            d.emplace_back(e.keywords[k], args[k]);
          } else if (args[k].kind == Value::kDict) {
            for (const auto& kv : *args[k].dict) d.push_back(kv);
          } else {
            fail("namespace() takes keyword arguments or a dict");
          }
        }
        Value v = Value::of_dict(std::move(d));
        v.ns = true;
        return v;
      }
      fail("calls other than methods, namespace, raise_exception and range are not supported");
    }
    case Expr::kFilter: {
      std::vector<Value> args;
      for (size_t k = 1; k < e.args.size(); ++k) args.push_back(eval(*e.args[k], scope));
      return apply_filter(e.name, eval(*e.args[0], scope), args);
    }
    case Expr::kTest: {
      std::vector<Value> args;
      for (size_t k = 1; k < e.args.size(); ++k) args.push_back(eval(*e.args[k], scope));
      return Value::boolean(apply_test(e.name, eval(*e.args[0], scope), args) != e.negate);
    }
    case Expr::kUnary: {
      const Value v = eval(*e.args[0], scope);
      if (e.name == "not") return Value::boolean(!v.truthy());
      return v.kind == Value::kFloat ? Value::real(-v.f) : Value::integer(-v.i);
    }
    case Expr::kIf:
      return eval(*e.args[0], scope).truthy() ? eval(*e.args[1], scope) : eval(*e.args[2], scope);
    case Expr::kListLit: {
      List l;
      for (const auto& a : e.args) l.push_back(eval(*a, scope));
      return Value::of_list(std::move(l));
    }
    case Expr::kDictLit: {
      Dict d;
      for (size_t k = 0; k + 1 < e.args.size(); k += 2)
        d.emplace_back(to_str(eval(*e.args[k], scope)), eval(*e.args[k + 1], scope));
      return Value::of_dict(std::move(d));
    }
    case Expr::kBinary: {
      const std::string& op = e.name;
      const Value a = eval(*e.args[0], scope);
      if (op == "and") return a.truthy() ? eval(*e.args[1], scope) : a;
      if (op == "or") return a.truthy() ? a : eval(*e.args[1], scope);
      const Value b = eval(*e.args[1], scope);
      if (op == "==") return Value::boolean(equal(a, b));
      if (op == "!=") return Value::boolean(!equal(a, b));
      if (op == "~") return Value::str(to_str(a) + to_str(b));
      if (op == "in") {
        if (b.kind == Value::kString)
          return Value::boolean(b.s.find(to_str(a)) != std::string::npos);
        if (b.kind == Value::kList) {
          for (const Value& x : *b.list)
            if (equal(a, x)) return Value::boolean(true);
          return Value::boolean(false);
        }
        if (b.kind == Value::kDict) return Value::boolean(b.get(to_str(a)) != nullptr);
        return Value::boolean(false);
      }
      if (op == "+" && a.kind == Value::kString && b.kind == Value::kString)
        return Value::str(a.s + b.s);
      if (op == "+" && a.kind == Value::kList && b.kind == Value::kList) {
        List l = *a.list;
        l.insert(l.end(), b.list->begin(), b.list->end());
        return Value::of_list(std::move(l));
      }
      if (op == "<" || op == ">" || op == "<=" || op == ">=") {
        const bool str = a.kind == Value::kString && b.kind == Value::kString;
        const int c = str ? a.s.compare(b.s) : (a.num() < b.num() ? -1 : a.num() > b.num() ? 1 : 0);
        return Value::boolean(op == "<" ? c < 0 : op == ">" ? c > 0 : op == "<=" ? c <= 0 : c >= 0);
      }
      if (!a.numeric() || !b.numeric()) fail("`" + op + "` needs numbers");
      const bool ints = a.kind != Value::kFloat && b.kind != Value::kFloat;
      if (op == "+") return ints ? Value::integer(a.i + b.i) : Value::real(a.num() + b.num());
      if (op == "-") return ints ? Value::integer(a.i - b.i) : Value::real(a.num() - b.num());
      if (op == "*") return ints ? Value::integer(a.i * b.i) : Value::real(a.num() * b.num());
      if (b.num() == 0) fail("division by zero");
      if (op == "/") return Value::real(a.num() / b.num());
      if (op == "//") return Value::integer(static_cast<int64_t>(a.num() / b.num()));
      if (op == "%")
        return ints ? Value::integer(a.i % b.i) : Value::real(std::fmod(a.num(), b.num()));
      fail("operator `" + op + "` is not supported");
    }
  }
  return Value();
}

void exec(const std::vector<Node>& nodes, Scope& scope, std::string& out) {
  for (const Node& n : nodes) {
    switch (n.kind) {
      case Node::kText:
        out += n.text;
        break;
      case Node::kOutput:
        out += to_str(eval(*n.expr, scope));
        break;
      case Node::kSet:
        if (const size_t dot = n.vars[0].find('.'); dot != std::string::npos) {
          // set ns.attr = value: into the namespace object itself (every holder sees it)
          const Value target = scope.lookup(n.vars[0].substr(0, dot));
          if (!target.ns) fail("`set " + n.vars[0] + "`: only a namespace() takes attributes");
          const std::string attr = n.vars[0].substr(dot + 1);
          Value v = eval(*n.expr, scope);
          auto it = std::find_if(target.dict->begin(), target.dict->end(),
                                 [&](const auto& kv) { return kv.first == attr; });
          if (it != target.dict->end())
            it->second = std::move(v);
          else
            target.dict->emplace_back(attr, std::move(v));
        } else {
          scope.set(n.vars[0], eval(*n.expr, scope));
        }
        break;
      case Node::kIf:
        for (const auto& [cond, body] : n.branches) {
          if (!cond || eval(*cond, scope).truthy()) {
            exec(body, scope, out);
            break;
          }
        }
        break;
      case Node::kFor: {
        Value seq = eval(*n.expr, scope);
        List items;
        if (seq.kind == Value::kList)
          items = *seq.list;
        else if (seq.kind == Value::kDict)
          for (const auto& kv : *seq.dict) items.push_back(Value::str(kv.first));
        const int64_t len = static_cast<int64_t>(items.size());
        for (int64_t k = 0; k < len; ++k) {
          scope.push();
          if (n.vars.size() == 1) {
            scope.set(n.vars[0], items[k]);
          } else {
            for (size_t v = 0; v < n.vars.size(); ++v)
              scope.set(n.vars[v], item(items[k], Value::integer(static_cast<int64_t>(v))));
          }
          scope.set("loop", Value::of_dict({{"index", Value::integer(k + 1)},
                                            {"index0", Value::integer(k)},
                                            {"revindex", Value::integer(len - k)},
                                            {"revindex0", Value::integer(len - k - 1)},
                                            {"first", Value::boolean(k == 0)},
                                            {"last", Value::boolean(k == len - 1)},
                                            {"length", Value::integer(len)}}));
          exec(n.body, scope, out);
          scope.pop();
        }
        break;
      }
    }
  }
}

}  // namespace

std::string render(const std::vector<Node>& program, const Dict& variables) {
  Scope scope;
  for (const auto& [name, value] : variables) scope.set_global(name, value);
  std::string out;
  exec(program, scope, out);
  return out;
}

}  // namespace kestrel::server::jinja
