// `kestrel tokenize` and `kestrel detokenize`: the tokenizer from the command
// line, for checking ids against HF tokenizers and for scripts (--json).
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/error.h"
#include "text/tokenizer.h"

namespace kestrel::cli {

namespace {

struct TokenizerSource {
  std::string file;
  std::string model_dir;
};

void add_source_options(CLI::App* cmd, TokenizerSource& src) {
  auto* file = cmd->add_option("--tokenizer", src.file, "tokenizer.json to load");
  auto* dir = cmd->add_option("--model", src.model_dir, "model folder holding tokenizer.json");
  file->excludes(dir);
  dir->excludes(file);
}

text::Tokenizer load(const TokenizerSource& src) {
  KESTREL_CHECK(!src.file.empty() || !src.model_dir.empty(),
                "give the tokenizer with --tokenizer FILE or --model DIR");
  return src.file.empty() ? text::Tokenizer::from_model_dir(src.model_dir)
                          : text::Tokenizer::from_file(src.file);
}

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  KESTREL_CHECK(in.good(), "cannot open ", path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<int32_t> parse_ids(const std::string& list) {
  std::vector<int32_t> ids;
  std::stringstream ss(list);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    KESTREL_CHECK(used == item.size() && !item.empty() && v >= 0 && v <= INT32_MAX, "--ids: '",
                  item, "' is not a token id (expected e.g. 1,2,3)");
    ids.push_back(static_cast<int32_t>(v));
  }
  return ids;
}

void print_tokens(const text::Tokenizer& tok, const std::vector<int32_t>& ids, bool json) {
  if (json) {
    nlohmann::json out = nlohmann::json::object();
    out["ids"] = ids;
    auto& tokens = out["tokens"] = nlohmann::json::array();
    for (int32_t id : ids) tokens.push_back(std::string(tok.token(id)));
    std::cout << out.dump() << "\n";
    return;
  }
  std::cout << ids.size() << " tokens\n";
  for (int32_t id : ids) {
    std::cout << "  " << id << "\t" << nlohmann::json(std::string(tok.token(id))).dump()
              << (tok.is_special(id) ? "\t(special)" : "") << "\n";
  }
}

}  // namespace

void add_tokenize_commands(CLI::App& app) {
  auto src = std::make_shared<TokenizerSource>();
  auto text = std::make_shared<std::string>();
  auto file = std::make_shared<std::string>();
  auto json = std::make_shared<bool>(false);
  auto no_special = std::make_shared<bool>(false);
  auto* tokenize = app.add_subcommand("tokenize", "print the token ids of a text");
  add_source_options(tokenize, *src);
  auto* text_opt = tokenize->add_option("--text", *text, "the text to tokenize");
  auto* file_opt = tokenize->add_option("--file", *file, "a file holding the text");
  text_opt->excludes(file_opt);
  file_opt->excludes(text_opt);
  tokenize->add_flag("--json", *json, R"(print {"ids":[...],"tokens":[...]})");
  tokenize->add_flag("--no-special", *no_special, "do not add bos/eos tokens");
  tokenize->callback([=] {
    KESTREL_CHECK(text_opt->count() || file_opt->count(), "give the text with --text or --file");
    const auto tok = load(*src);
    const std::string input = text_opt->count() ? *text : read_text_file(*file);
    print_tokens(tok, tok.encode(input, !*no_special), *json);
  });

  auto dsrc = std::make_shared<TokenizerSource>();
  auto ids = std::make_shared<std::string>();
  auto skip = std::make_shared<bool>(false);
  auto* detok = app.add_subcommand("detokenize", "print the text of token ids");
  add_source_options(detok, *dsrc);
  detok->add_option("--ids", *ids, "comma-separated token ids, e.g. 1,2,3")->required();
  detok->add_flag("--skip-special", *skip, "leave special tokens out");
  detok->callback([=] {
    const auto tok = load(*dsrc);
    std::cout << tok.decode(parse_ids(*ids), *skip) << "\n";
  });
}

}  // namespace kestrel::cli
