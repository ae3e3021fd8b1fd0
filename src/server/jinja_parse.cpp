// The Jinja subset's parser (see jinja.h): expression lexer and parser, segmenting, statements.
#include <cctype>
#include <initializer_list>
#include <sstream>

#include "core/error.h"
#include "server/jinja.h"

namespace kestrel::server::jinja {

[[noreturn]] void fail(const std::string& msg) {
  throw ValidationError("messages", "chat template: " + msg);
}

namespace {

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
  // A left-associative chain: next (op next)*, op one of `ops` (keywords when `words`, else
  // operator tokens), each a binary node.
  ExprPtr chain(std::initializer_list<const char*> ops, bool words, ExprPtr (ExprParser::*next)()) {
    ExprPtr e = (this->*next)();
    for (;;) {
      const char* hit = nullptr;
      for (const char* o : ops)
        if (words ? is_name(o) : is_op(o)) {
          hit = o;
          break;
        }
      if (!hit) return e;
      ++p_;
      e = node(Expr::kBinary, hit, {e, (this->*next)()});
    }
  }
  ExprPtr or_expr() { return chain({"or"}, true, &ExprParser::and_expr); }
  ExprPtr and_expr() { return chain({"and"}, true, &ExprParser::not_expr); }
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
  ExprPtr concat() { return chain({"~"}, false, &ExprParser::add); }
  ExprPtr add() { return chain({"+", "-"}, false, &ExprParser::mul); }
  ExprPtr mul() { return chain({"*", "/", "%", "//"}, false, &ExprParser::unary); }
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

}  // namespace

std::vector<Node> parse(const std::string& source) {
  return StmtParser(segment(source)).parse();
}

}  // namespace kestrel::server::jinja
