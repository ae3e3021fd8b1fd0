// ChatTemplate: the Falcon-instruct default, or a Jinja template (jinja.h) parsed and rendered.
#include "server/chat_template.h"

#include <fstream>

#include "core/error.h"
#include "server/jinja.h"
#include "server/json_util.h"

namespace kestrel::server {

struct ChatTemplate::Program {
  std::vector<jinja::Node> nodes;
};

ChatTemplate::ChatTemplate() = default;

ChatTemplate ChatTemplate::from_jinja(const std::string& source, std::string bos_token,
                                      std::string eos_token) {
  ChatTemplate t;
  auto program = std::make_shared<Program>();
  try {
    program->nodes = jinja::parse(source);
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
  jinja::List msgs;
  for (const ChatMessage& m : messages)
    msgs.push_back(jinja::Value::of_dict(
        {{"role", jinja::Value::str(m.role)}, {"content", jinja::Value::str(m.content)}}));
  return jinja::render(program_->nodes,
                       {{"messages", jinja::Value::of_list(std::move(msgs))},
                        {"add_generation_prompt", jinja::Value::boolean(add_generation_prompt)},
                        {"bos_token", jinja::Value::str(bos_token_)},
                        {"eos_token", jinja::Value::str(eos_token_)}});
}

}  // namespace kestrel::server
