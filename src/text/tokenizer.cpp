// Tokenizer: loading tokenizer.json (rejecting every component it does not
// implement, by name), and the encode / decode pipelines.
#include "text/tokenizer.h"

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "text/added_tokens.h"
#include "text/bpe.h"
#include "text/pre_tokenizer.h"
#include "text/unicode.h"

namespace kestrel::text {

struct Tokenizer::Impl {
  std::unique_ptr<Bpe> bpe;
  AddedTokens added;
  PreTokenizer pre_tokenizer;
  bool byte_level_decoder = false;
  std::vector<std::string> id_to_token;  // "" where no token has that id
  std::vector<bool> has_token;
  std::vector<std::string> decoded;  // per id: what the decoder turns it into
  std::optional<int32_t> bos, eos;
  bool add_bos = false, add_eos = false;
};

namespace {

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  KESTREL_CHECK(in.good(), "cannot open ", path.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

nlohmann::json parse_json(std::string_view text, std::string_view what) {
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    KESTREL_FAIL(what, ": malformed JSON: ", e.what());
  }
}

std::string type_of(const nlohmann::json& j) {
  if (j.is_object() && j.contains("type") && j["type"].is_string())
    return j["type"].get<std::string>();
  return j.dump();
}

void check_normalizer(const nlohmann::json& j) {
  if (j.is_null()) return;
  if (j.is_object() && type_of(j) == "Sequence" && j.contains("normalizers") &&
      j["normalizers"].is_array() && j["normalizers"].empty())
    return;
  KESTREL_FAIL("unsupported normalizer type '", type_of(j), "' (supported: null)");
}

void check_post_processor(const nlohmann::json& j) {
  // ByteLevel post-processing only trims offsets: ids are unchanged.
  if (j.is_null() || type_of(j) == "ByteLevel") return;
  KESTREL_FAIL("unsupported post_processor type '", type_of(j), "' (supported: null, ByteLevel)");
}

// HF applies both to every encode, so they would change the ids. kestrel
// truncates prompts itself; padding is only accepted where it is a no-op on
// one text (BatchLongest with no pad_to_multiple_of).
void check_truncation_padding(const nlohmann::json& j) {
  if (j.contains("truncation") && !j["truncation"].is_null()) {
    KESTREL_FAIL("unsupported 'truncation' ", j["truncation"].dump(),
                 " (supported: null; kestrel truncates prompts itself)");
  }
  if (!j.contains("padding") || j["padding"].is_null()) return;
  const auto& p = j["padding"];
  const bool batch_longest = p.is_object() && p.contains("strategy") && p["strategy"].is_string() &&
                             p["strategy"] == "BatchLongest";
  const bool no_multiple =
      p.is_object() && (!p.contains("pad_to_multiple_of") || p["pad_to_multiple_of"].is_null());
  if (!batch_longest || !no_multiple) {
    KESTREL_FAIL("unsupported 'padding' ", p.dump(),
                 " (supported: null, or BatchLongest without pad_to_multiple_of)");
  }
}

bool parse_decoder(const nlohmann::json& j) {
  if (j.is_null()) return false;
  if (type_of(j) == "ByteLevel") return true;
  KESTREL_FAIL("unsupported decoder type '", type_of(j), "' (supported: ByteLevel, null)");
}

// What HF's ByteLevel decoder makes of one token: its bytes when every char is
// in the byte-level alphabet, else the token's own UTF-8.
std::string byte_level_bytes(std::string_view token) {
  std::string out;
  for (size_t i = 0; i < token.size();) {
    size_t len;
    const int b = unicode_to_byte(decode_utf8(token, i, len));
    if (b < 0) return std::string(token);
    out.push_back(static_cast<char>(b));
    i += len;
  }
  return out;
}

// A special-token name from tokenizer_config.json: "x" or {"content": "x", ...}.
std::optional<std::string> config_token(const nlohmann::json& cfg, const char* key) {
  if (!cfg.contains(key) || cfg[key].is_null()) return std::nullopt;
  const auto& v = cfg[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string())
    return v["content"].get<std::string>();
  KESTREL_FAIL("tokenizer_config.json: '", key, "' must be a string or {\"content\": ...}");
}

void build_id_tables(Tokenizer::Impl& t) {
  const int32_t n = std::max(t.bpe->max_id(), t.added.max_id()) + 1;
  // Tables are dense by id: refuse ids far past the number of tokens.
  const size_t n_tokens = t.bpe->vocab().size() + t.added.by_id().size();
  KESTREL_CHECK(static_cast<size_t>(n) <= 4 * n_tokens + 65536,
                "vocabulary ids are too sparse: id ", n - 1, " for ", n_tokens, " tokens");
  t.id_to_token.assign(n, {});
  t.has_token.assign(n, false);
  for (const auto& [token, id] : t.bpe->vocab()) {
    t.id_to_token[id] = token;
    t.has_token[id] = true;
  }
  for (const auto& [id, token] : t.added.by_id()) {
    t.id_to_token[id] = token.content;
    t.has_token[id] = true;
  }
  t.decoded.resize(n);
  for (int32_t id = 0; id < n; ++id) {
    t.decoded[id] = t.byte_level_decoder ? byte_level_bytes(t.id_to_token[id]) : t.id_to_token[id];
  }
}

void apply_config(Tokenizer::Impl& t, const Tokenizer& tok, const nlohmann::json& cfg) {
  KESTREL_CHECK(cfg.is_object(), "tokenizer_config.json must be a JSON object");
  auto resolve = [&](const char* key) -> std::optional<int32_t> {
    const auto name = config_token(cfg, key);
    if (!name) return std::nullopt;
    const auto id = tok.token_id(*name);
    KESTREL_CHECK(id, "tokenizer_config.json: ", key, " '", *name, "' is not in the vocabulary");
    return id;
  };
  t.bos = resolve("bos_token");
  if (auto eos = resolve("eos_token")) t.eos = eos;
  auto flag = [&](const char* key) {
    return cfg.contains(key) && cfg[key].is_boolean() && cfg[key].get<bool>();
  };
  t.add_bos = flag("add_bos_token");
  t.add_eos = flag("add_eos_token");
  // As transformers refuses it: asking for a token that is not named.
  KESTREL_CHECK(!t.add_bos || t.bos,
                "tokenizer_config.json: add_bos_token is true but no bos_token");
  KESTREL_CHECK(!t.add_eos || t.eos,
                "tokenizer_config.json: add_eos_token is true but no eos_token");
}

// Encodes the words of one text piece with the BPE model.
class BpeSink final : public WordSink {
 public:
  BpeSink(const Bpe& bpe, Bpe::Scratch& scratch, std::vector<int32_t>& out)
      : bpe_(bpe), scratch_(scratch), out_(out) {}
  void word(std::string_view w) override { bpe_.encode_word(w, scratch_, out_); }

 private:
  const Bpe& bpe_;
  Bpe::Scratch& scratch_;
  std::vector<int32_t>& out_;
};

}  // namespace

Tokenizer Tokenizer::from_json(std::string_view tokenizer_json, std::string_view config_json) {
  const nlohmann::json j = parse_json(tokenizer_json, "tokenizer.json");
  auto impl = std::make_shared<Impl>();
  try {
    KESTREL_CHECK(j.is_object(), "tokenizer.json must be a JSON object");
    KESTREL_CHECK(j.contains("model"), "tokenizer.json has no 'model'");
    check_normalizer(j.value("normalizer", nlohmann::json()));
    check_truncation_padding(j);
    check_post_processor(j.value("post_processor", nlohmann::json()));
    impl->byte_level_decoder = parse_decoder(j.value("decoder", nlohmann::json()));
    impl->bpe = Bpe::from_json(j["model"]);
    impl->added = AddedTokens::from_json(j.value("added_tokens", nlohmann::json()), *impl->bpe);
    impl->pre_tokenizer = PreTokenizer::from_json(j.value("pre_tokenizer", nlohmann::json()));
  } catch (const nlohmann::json::exception& e) {
    KESTREL_FAIL("tokenizer.json: unexpected structure: ", e.what());
  }
  build_id_tables(*impl);
  Tokenizer tok(impl);
  // Without a config, Falcon's end of text is its eos (as its config.json says).
  if (auto eot = impl->added.token_id("<|endoftext|>")) impl->eos = eot;
  if (!config_json.empty()) {
    try {
      apply_config(*impl, tok, parse_json(config_json, "tokenizer_config.json"));
    } catch (const nlohmann::json::exception& e) {
      KESTREL_FAIL("tokenizer_config.json: unexpected structure: ", e.what());
    }
  }
  return tok;
}

Tokenizer Tokenizer::from_file(const std::filesystem::path& path) {
  const std::string json = read_file(path);
  const auto config = path.parent_path() / "tokenizer_config.json";
  const std::string config_json = std::filesystem::exists(config) ? read_file(config) : "";
  try {
    return from_json(json, config_json);
  } catch (const Error& e) {
    KESTREL_FAIL(path.string(), ": ", e.what());
  }
}

Tokenizer Tokenizer::from_model_dir(const std::filesystem::path& dir) {
  const auto path = dir / "tokenizer.json";
  KESTREL_CHECK(std::filesystem::exists(path), "model folder ", dir.string(),
                " has no tokenizer.json");
  return from_file(path);
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  check_utf8(text);
  const Impl& t = *impl_;
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  if (add_special_tokens && t.add_bos && t.bos) ids.push_back(*t.bos);
  std::vector<AddedTokens::Piece> pieces;
  t.added.split(text, pieces);
  PreTokenizer::Scratch pre_scratch;
  Bpe::Scratch bpe_scratch;
  BpeSink sink(*t.bpe, bpe_scratch, ids);
  for (const auto& p : pieces) {
    if (p.id >= 0) {
      ids.push_back(p.id);
    } else {
      t.pre_tokenizer.run(text.substr(p.start, p.end - p.start), pre_scratch, sink);
    }
  }
  if (add_special_tokens && t.add_eos && t.eos) ids.push_back(*t.eos);
  return ids;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  const Impl& t = *impl_;
  std::string out;
  bool first = true;
  for (const int32_t id : ids) {
    if (id < 0 || id >= static_cast<int32_t>(t.has_token.size()) || !t.has_token[id]) continue;
    if (skip_special_tokens && t.added.is_special(id)) continue;
    // Without a decoder HF joins the tokens with spaces.
    if (!t.byte_level_decoder && !first) out.push_back(' ');
    out += t.decoded[id];
    first = false;
  }
  return t.byte_level_decoder ? utf8_lossy(out) : out;
}

std::string_view Tokenizer::token(int32_t id) const {
  const Impl& t = *impl_;
  KESTREL_CHECK(id >= 0 && id < static_cast<int32_t>(t.has_token.size()) && t.has_token[id],
                "token id ", id, " is not in the vocabulary (size ", t.has_token.size(), ")");
  return t.id_to_token[id];
}

std::optional<int32_t> Tokenizer::token_id(std::string_view token) const {
  if (auto id = impl_->added.token_id(token)) return id;
  return impl_->bpe->token_id(token);
}

int32_t Tokenizer::vocab_size() const {
  return static_cast<int32_t>(impl_->has_token.size());
}
std::optional<int32_t> Tokenizer::bos_id() const {
  return impl_->bos;
}
std::optional<int32_t> Tokenizer::eos_id() const {
  return impl_->eos;
}
bool Tokenizer::is_special(int32_t id) const {
  return impl_->added.is_special(id);
}

}  // namespace kestrel::text
