// Chat prompt formatting for /v1/chat/completions: the model folder's
// tokenizer_config.json `chat_template` (a Jinja subset, see docs/server.md),
// else Falcon-instruct's "User: ...\nAssistant:" convention.
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "server/openai.h"

namespace kestrel::server {

class ChatTemplate {
 public:
  // The Falcon-instruct convention: "System: s\nUser: u\nAssistant: a\n...Assistant:".
  ChatTemplate();
  // A Jinja template; throws kestrel::Error naming the construct it cannot parse.
  static ChatTemplate from_jinja(const std::string& source, std::string bos_token = "",
                                 std::string eos_token = "");
  // tokenizer_config.json's chat_template (and bos/eos tokens) when DIR has one, else the default.
  static ChatTemplate from_model_dir(const std::filesystem::path& dir);

  // Throws ValidationError("messages", ...) for what the template refuses
  // (raise_exception) or cannot evaluate.
  std::string render(const std::vector<ChatMessage>& messages,
                     bool add_generation_prompt = true) const;
  bool is_default() const { return !program_; }
  const std::string& source() const { return source_; }

  struct Program;

 private:
  std::shared_ptr<const Program> program_;  // null: the built-in Falcon convention
  std::string source_;
  std::string bos_token_, eos_token_;
};

}  // namespace kestrel::server
