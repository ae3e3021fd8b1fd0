// A Jinja subset, enough for Hugging Face chat templates (Falcon's among
// them): text, {{ expr }}, {% if/elif/else %}, {% for x in xs %} with `loop`,
// {% set %}, whitespace control (-), trim_blocks and lstrip_blocks as
// transformers sets them; expressions with literals, attribute and item access,
// slices, and/or/not, comparisons, in, is (defined, none, string, ...), + ~ * /
// %, inline if, filters (trim, length, upper, lower, default, join, first,
// last, tojson) and string methods (strip, upper, lower, startswith, ...).
#include "server/chat_template.h"

#include <algorithm>
#include <fstream>
#include <map>
#include <sstream>

#include "core/error.h"
#include "engine/sampling_params.h"
#include "server/json_util.h"

namespace kestrel::server {
namespace {

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

[[noreturn]] void fail(const std::string& msg) {
  throw ValidationError("messages", "chat template: " + msg);
}

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

// ---- expressions ----------------------------------------------------------

struct Tok {
  enum Kind { kName, kString, kInt, kFloat, kOp, kEnd } kind;
  std::string text;
};

std::vector<Tok> lex_expr(const std::string& src) {
  std::vector<Tok> out;
  size_t i = 0;
  while (i < src.size()) {
    const char c = src[i];
    if (std::isspace(static_cast<unsigned char>(c))) {
      ++i;
      continue;
    }
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t j = i;
      while (j < src.size() && (std::isalnum(static_cast<unsigned char>(src[j])) || src[j] == '_'))
        ++j;
      out.push_back({Tok::kName, src.substr(i, j - i)});
      i = j;
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t j = i;
      bool real = false;
      while (j < src.size() && (std::isdigit(static_cast<unsigned char>(src[j])) || src[j] == '.'))
        real |= src[j++] == '.';
      out.push_back({real ? Tok::kFloat : Tok::kInt, src.substr(i, j - i)});
      i = j;
    } else if (c == '\'' || c == '"') {
      std::string s;
      size_t j = i + 1;
      for (; j < src.size() && src[j] != c; ++j) {
        if (src[j] == '\\' && j + 1 < src.size()) {
          const char e = src[++j];
          s += e == 'n' ? '\n' : e == 't' ? '\t' : e == 'r' ? '\r' : e;
        } else {
          s += src[j];
        }
      }
      if (j >= src.size()) fail("unterminated string in `" + src + "`");
      out.push_back({Tok::kString, s});
      i = j + 1;
    } else {
      static const char* kTwo[] = {"==", "!=", "<=", ">=", "//", "**"};
      std::string op(1, c);
      for (const char* t : kTwo)
        if (src.compare(i, 2, t) == 0) op = t;
      if (std::string("=!<>+-*/%~()[]{}.,:|").find(c) == std::string::npos)
        fail(std::string("unexpected `") + c + "`");
      out.push_back({Tok::kOp, op});
      i += op.size();
    }
  }
  out.push_back({Tok::kEnd, ""});
  return out;
}

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

ExprPtr node(Expr::Kind k, std::string name = {}, std::vector<ExprPtr> args = {}) {
  auto e = std::make_shared<Expr>();
  e->kind = k;
  e->name = std::move(name);
  e->args = std::move(args);
  return e;
}

class ExprParser {
 public:
  explicit ExprParser(std::vector<Tok> toks) : t_(std::move(toks)) {}
  ExprPtr parse_all() {
    ExprPtr e = expr();
    if (t_[p_].kind != Tok::kEnd) fail("unexpected `" + t_[p_].text + "`");
    return e;
  }
  ExprPtr expr() {
    ExprPtr e = or_expr();
    if (is_name("if")) {
      ++p_;
      ExprPtr cond = or_expr();
      ExprPtr other = node(Expr::kLit);
      other->lit = Value::str("");
      if (is_name("else")) {
        ++p_;
        other = expr();
      }
      return node(Expr::kIf, "", {cond, e, other});
    }
    return e;
  }
  bool at_end() const { return t_[p_].kind == Tok::kEnd; }
  bool is_name(const char* n) const { return t_[p_].kind == Tok::kName && t_[p_].text == n; }
  bool is_op(const char* o) const { return t_[p_].kind == Tok::kOp && t_[p_].text == o; }
  void expect_op(const char* o) {
    if (!is_op(o)) fail(std::string("expected `") + o + "`, got `" + t_[p_].text + "`");
    ++p_;
  }
  std::string expect_name() {
    if (t_[p_].kind != Tok::kName) fail("expected a name, got `" + t_[p_].text + "`");
    return t_[p_++].text;
  }

 private:
  ExprPtr or_expr() {
    ExprPtr e = and_expr();
    while (is_name("or")) {
      ++p_;
      e = node(Expr::kBinary, "or", {e, and_expr()});
    }
    return e;
  }
  ExprPtr and_expr() {
    ExprPtr e = not_expr();
    while (is_name("and")) {
      ++p_;
      e = node(Expr::kBinary, "and", {e, not_expr()});
    }
    return e;
  }
  ExprPtr not_expr() {
    if (is_name("not")) {
      ++p_;
      return node(Expr::kUnary, "not", {not_expr()});
    }
    return cmp();
  }
  ExprPtr cmp() {
    ExprPtr e = concat();
    for (;;) {
      static const char* kOps[] = {"==", "!=", "<", ">", "<=", ">="};
      bool matched = false;
      for (const char* o : kOps)
        if (is_op(o)) {
          ++p_;
          e = node(Expr::kBinary, o, {e, concat()});
          matched = true;
          break;
        }
      if (matched) continue;
      if (is_name("in")) {
        ++p_;
        e = node(Expr::kBinary, "in", {e, concat()});
        continue;
      }
      if (is_name("not") && t_[p_ + 1].kind == Tok::kName && t_[p_ + 1].text == "in") {
        p_ += 2;
        e = node(Expr::kUnary, "not", {node(Expr::kBinary, "in", {e, concat()})});
        continue;
      }
      if (is_name("is")) {
        ++p_;
        bool neg = false;
        if (is_name("not")) {
          ++p_;
          neg = true;
        }
        ExprPtr t = node(Expr::kTest, expect_name(), {e});
        if (t->name == "none" || t->name == "None") t->name = "none";
        if (t_[p_].kind != Tok::kEnd && (t_[p_].kind == Tok::kString || t_[p_].kind == Tok::kInt))
          t->args.push_back(primary());
        t->negate = neg;
        e = t;
        continue;
      }
      return e;
    }
  }
  ExprPtr concat() {
    ExprPtr e = add();
    while (is_op("~")) {
      ++p_;
      e = node(Expr::kBinary, "~", {e, add()});
    }
    return e;
  }
  ExprPtr add() {
    ExprPtr e = mul();
    while (is_op("+") || is_op("-")) {
      std::string o = t_[p_++].text;
      e = node(Expr::kBinary, o, {e, mul()});
    }
    return e;
  }
  ExprPtr mul() {
    ExprPtr e = unary();
    while (is_op("*") || is_op("/") || is_op("%") || is_op("//")) {
      std::string o = t_[p_++].text;
      e = node(Expr::kBinary, o, {e, unary()});
    }
    return e;
  }
  ExprPtr unary() {
    if (is_op("-")) {
      ++p_;
      return node(Expr::kUnary, "-", {unary()});
    }
    return postfix(primary());
  }
  // After '('. Keyword arguments are taken by position, their names kept in `keywords` if given.
  std::vector<ExprPtr> call_args(std::vector<std::string>* keywords = nullptr) {
    std::vector<ExprPtr> args;
    while (!is_op(")")) {
      std::string keyword;
      if (t_[p_].kind == Tok::kName && t_[p_ + 1].kind == Tok::kOp && t_[p_ + 1].text == "=") {
        keyword = t_[p_].text;
        p_ += 2;
      }
      if (keywords) keywords->push_back(keyword);
      args.push_back(expr());
      if (!is_op(")")) expect_op(",");
    }
    ++p_;
    return args;
  }
  ExprPtr postfix(ExprPtr e) {
    for (;;) {
      if (is_op(".")) {
        ++p_;
        e = node(Expr::kAttr, expect_name(), {e});
      } else if (is_op("[")) {
        ++p_;
        ExprPtr lo = is_op(":") ? nullptr : expr();
        if (is_op(":")) {
          ++p_;
          ExprPtr hi = is_op("]") ? nullptr : expr();
          expect_op("]");
          e = node(Expr::kSlice, "", {e, lo, hi});
        } else {
          expect_op("]");
          e = node(Expr::kItem, "", {e, lo});
        }
      } else if (is_op("(")) {
        ++p_;
        std::vector<ExprPtr> args{e};
        std::vector<std::string> keywords;
        for (auto& a : call_args(&keywords)) args.push_back(a);
        e = node(Expr::kCall, "", std::move(args));
        e->keywords = std::move(keywords);
      } else if (is_op("|")) {
        ++p_;
        ExprPtr f = node(Expr::kFilter, expect_name(), {e});
        if (is_op("(")) {
          ++p_;
          for (auto& a : call_args()) f->args.push_back(a);
        }
        e = f;
      } else {
        return e;
      }
    }
  }
  ExprPtr primary() {
    const Tok& t = t_[p_];
    ExprPtr e = node(Expr::kLit);
    switch (t.kind) {
      case Tok::kString:
        ++p_;
        e->lit = Value::str(t.text);
        return e;
      case Tok::kInt:
        ++p_;
        e->lit = Value::integer(std::stoll(t.text));
        return e;
      case Tok::kFloat:
        ++p_;
        e->lit = Value::real(std::stod(t.text));
        return e;
      case Tok::kName:
        ++p_;
        if (t.text == "true" || t.text == "True") {
          e->lit = Value::boolean(true);
          return e;
        }
        if (t.text == "false" || t.text == "False") {
          e->lit = Value::boolean(false);
          return e;
        }
        if (t.text == "none" || t.text == "None") {
          e->lit = Value::none();
          return e;
        }
        return node(Expr::kName, t.text);
      case Tok::kOp:
        if (t.text == "(") {
          ++p_;
          ExprPtr inner = expr();
          expect_op(")");
          return inner;
        }
        if (t.text == "[") {
          ++p_;
          ExprPtr l = node(Expr::kListLit);
          while (!is_op("]")) {
            l->args.push_back(expr());
            if (!is_op("]")) expect_op(",");
          }
          ++p_;
          return l;
        }
        if (t.text == "{") {
          ++p_;
          ExprPtr d = node(Expr::kDictLit);
          while (!is_op("}")) {
            d->args.push_back(expr());
            expect_op(":");
            d->args.push_back(expr());
            if (!is_op("}")) expect_op(",");
          }
          ++p_;
          return d;
        }
        break;
      case Tok::kEnd:
        break;
    }
    fail("unexpected `" + t.text + "`");
  }

  std::vector<Tok> t_;
  size_t p_ = 0;
};

ExprPtr parse_expr(const std::string& src) {
  return ExprParser(lex_expr(src)).parse_all();
}

// ---- statements -----------------------------------------------------------

struct Node {
  enum Kind { kText, kOutput, kIf, kFor, kSet } kind;
  std::string text;  // kText
  ExprPtr expr;      // output, for's iterable, set's value
  std::vector<std::pair<ExprPtr, std::vector<Node>>> branches;  // if: (cond or null for else, body)
  std::vector<std::string> vars;  // for: loop variables; set: the name
  std::vector<Node> body;
};

struct Segment {
  enum Kind { kText, kExpr, kStmt } kind;
  std::string text;
};

// Splits the source into text, {{ }} and {% %}, applying -, trim_blocks and lstrip_blocks.
std::vector<Segment> segment(const std::string& src) {
  std::vector<Segment> out;
  size_t i = 0;
  bool trim_next = false;     // strip leading whitespace of the next text
  bool trim_newline = false;  // trim_blocks: drop one newline after a block tag
  while (i < src.size()) {
    size_t open = src.find('{', i);
    while (open != std::string::npos && open + 1 < src.size() && src[open + 1] != '{' &&
           src[open + 1] != '%' && src[open + 1] != '#')
      open = src.find('{', open + 1);
    if (open == std::string::npos || open + 1 >= src.size()) open = src.size();
    std::string text = src.substr(i, open - i);
    if (trim_next)
      text.erase(0, text.find_first_not_of(" \t\r\n") == std::string::npos
                        ? text.size()
                        : text.find_first_not_of(" \t\r\n"));
    else if (trim_newline && !text.empty() && text[0] == '\n')
      text.erase(0, 1);
    trim_next = trim_newline = false;
    if (open >= src.size()) {
      if (!text.empty()) out.push_back({Segment::kText, text});
      break;
    }
    const char kind = src[open + 1];
    const bool strip_before = open + 2 < src.size() && src[open + 2] == '-';
    if (strip_before) {
      text.erase(text.find_last_not_of(" \t\r\n") == std::string::npos
                     ? 0
                     : text.find_last_not_of(" \t\r\n") + 1);
    } else if (kind == '%' || kind == '#') {  // lstrip_blocks: only whitespace since the line start
      const size_t nl = text.find_last_of('\n');
      const std::string tail = text.substr(nl == std::string::npos ? 0 : nl + 1);
      if (tail.find_first_not_of(" \t") == std::string::npos) text.erase(text.size() - tail.size());
    }
    if (!text.empty()) out.push_back({Segment::kText, text});
    const std::string close = kind == '{' ? "}}" : kind == '%' ? "%}" : "#}";
    const size_t end = src.find(close, open + 2);
    if (end == std::string::npos) fail("unterminated `{" + std::string(1, kind) + "`");
    size_t b = open + 2 + (strip_before ? 1 : 0), e = end;
    if (e > b && src[e - 1] == '-') {
      --e;
      trim_next = true;
    }
    if (kind != '{' && !trim_next) trim_newline = true;
    if (kind != '#')
      out.push_back({kind == '{' ? Segment::kExpr : Segment::kStmt, src.substr(b, e - b)});
    i = end + 2;
  }
  return out;
}

class StmtParser {
 public:
  explicit StmtParser(std::vector<Segment> segs) : s_(std::move(segs)) {}
  std::vector<Node> parse() {
    std::vector<Node> body = block({});
    if (p_ < s_.size()) fail("unexpected `{% " + s_[p_].text + " %}`");
    return body;
  }

 private:
  static std::string keyword(const std::string& stmt) {
    std::istringstream in(stmt);
    std::string k;
    in >> k;
    return k;
  }
  static std::string rest(const std::string& stmt) {
    const size_t start = stmt.find_first_not_of(" \t\r\n");
    const size_t sp = stmt.find_first_of(" \t\r\n", start);
    return sp == std::string::npos ? "" : stmt.substr(sp);
  }
  // Parses nodes until a statement whose keyword is in `stops` (left unconsumed).
  std::vector<Node> block(const std::vector<std::string>& stops) {
    std::vector<Node> out;
    while (p_ < s_.size()) {
      const Segment& seg = s_[p_];
      if (seg.kind == Segment::kText) {
        out.push_back({Node::kText, seg.text, nullptr, {}, {}, {}});
        ++p_;
        continue;
      }
      if (seg.kind == Segment::kExpr) {
        out.push_back({Node::kOutput, "", parse_expr(seg.text), {}, {}, {}});
        ++p_;
        continue;
      }
      const std::string k = keyword(seg.text);
      for (const std::string& s : stops)
        if (k == s) return out;
      ++p_;
      if (k == "if") {
        Node n{Node::kIf, "", nullptr, {}, {}, {}};
        ExprPtr cond = parse_expr(rest(seg.text));
        for (;;) {
          std::vector<Node> body = block({"elif", "else", "endif"});
          n.branches.emplace_back(cond, std::move(body));
          if (p_ >= s_.size()) fail("`if` without `endif`");
          const std::string end = keyword(s_[p_].text);
          const std::string arg = rest(s_[p_].text);
          ++p_;
          if (end == "endif") break;
          cond = end == "elif" ? parse_expr(arg) : nullptr;
          if (end == "else") {
            n.branches.emplace_back(nullptr, block({"endif"}));
            if (p_ >= s_.size()) fail("`if` without `endif`");
            ++p_;
            break;
          }
        }
        out.push_back(std::move(n));
      } else if (k == "for") {
        Node n{Node::kFor, "", nullptr, {}, {}, {}};
        const std::string r = rest(seg.text);
        const size_t in_pos = r.find(" in ");
        if (in_pos == std::string::npos) fail("`for` without `in`");
        std::string vars = r.substr(0, in_pos);
        std::istringstream vs(vars);
        for (std::string v; std::getline(vs, v, ',');) {
          v.erase(0, v.find_first_not_of(" \t"));
          v.erase(v.find_last_not_of(" \t") + 1);
          n.vars.push_back(v);
        }
        n.expr = parse_expr(r.substr(in_pos + 4));
        n.body = block({"endfor"});
        if (p_ >= s_.size()) fail("`for` without `endfor`");
        ++p_;
        out.push_back(std::move(n));
      } else if (k == "set") {
        const std::string r = rest(seg.text);
        const size_t eq = r.find('=');
        if (eq == std::string::npos) fail("`set` without `=` (block set is not supported)");
        std::string name = r.substr(0, eq);
        name.erase(0, name.find_first_not_of(" \t"));
        name.erase(name.find_last_not_of(" \t") + 1);
        Node n{Node::kSet, "", parse_expr(r.substr(eq + 1)), {}, {name}, {}};
        out.push_back(std::move(n));
      } else if (k == "generation" || k == "endgeneration") {
        // transformers' assistant-mask markers: no output of their own
      } else {
        fail("`{% " + k + " %}` is not supported");
      }
    }
    return out;
  }

  std::vector<Segment> s_;
  size_t p_ = 0;
};

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

struct ChatTemplate::Program {
  std::vector<Node> nodes;
};

ChatTemplate::ChatTemplate() = default;

ChatTemplate ChatTemplate::from_jinja(const std::string& source, std::string bos_token,
                                      std::string eos_token) {
  ChatTemplate t;
  auto program = std::make_shared<Program>();
  try {
    program->nodes = StmtParser(segment(source)).parse();
  } catch (const ValidationError& e) {
    KESTREL_FAIL("cannot parse chat_template: ", e.what());
  }
  t.program_ = std::move(program);
  t.source_ = source;
  t.bos_token_ = std::move(bos_token);
  t.eos_token_ = std::move(eos_token);
  return t;
}

ChatTemplate ChatTemplate::from_model_dir(const std::filesystem::path& dir) {
  const auto path = dir / "tokenizer_config.json";
  if (!std::filesystem::exists(path)) return ChatTemplate();
  std::ifstream in(path);
  json cfg = json::parse(in, nullptr, false);
  KESTREL_CHECK(!cfg.is_discarded(), path.string(), ": not valid JSON");
  auto tmpl = cfg.find("chat_template");
  if (tmpl == cfg.end() || tmpl->is_null()) return ChatTemplate();
  std::string source;
  if (tmpl->is_string()) {
    source = tmpl->get<std::string>();
  } else if (tmpl->is_array()) {  // [{name, template}]: the "default" one
    for (const json& t : *tmpl)
      if (t.value("name", "") == "default" && t.contains("template"))
        source = t["template"].get<std::string>();
  }
  if (source.empty()) return ChatTemplate();
  auto token_text = [&](const char* key) -> std::string {
    auto it = cfg.find(key);
    if (it == cfg.end()) return "";
    if (it->is_string()) return it->get<std::string>();
    if (it->is_object() && it->contains("content")) return (*it)["content"].get<std::string>();
    return "";
  };
  return from_jinja(source, token_text("bos_token"), token_text("eos_token"));
}

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages,
                                 bool add_generation_prompt) const {
  if (!program_) {
    std::string out;
    for (const ChatMessage& m : messages) {
      const std::string role = m.role == "system"      ? "System"
                               : m.role == "assistant" ? "Assistant"
                                                       : "User";
      out += role + ": " + m.content + "\n";
    }
    if (add_generation_prompt) out += "Assistant:";
    return out;
  }
  List msgs;
  for (const ChatMessage& m : messages)
    msgs.push_back(
        Value::of_dict({{"role", Value::str(m.role)}, {"content", Value::str(m.content)}}));
  Scope scope;
  scope.set_global("messages", Value::of_list(std::move(msgs)));
  scope.set_global("add_generation_prompt", Value::boolean(add_generation_prompt));
  scope.set_global("bos_token", Value::str(bos_token_));
  scope.set_global("eos_token", Value::str(eos_token_));
  std::string out;
  exec(program_->nodes, scope, out);
  return out;
}

}  // namespace kestrel::server
