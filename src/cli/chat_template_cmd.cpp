// `kestrel chat-template`: renders conversations through a model folder's chat template (its
// tokenizer_config.json, else the Falcon default) exactly as /v1/chat/completions does, to see
// the prompt a chat request becomes and to check a template against another renderer.
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/error.h"
#include "server/chat_template.h"

namespace kestrel::cli {
namespace {

using nlohmann::json;

struct ChatTemplateArgs {
  std::string model_dir;
  std::string conversations;
  bool json_out = false;
};

struct Conversation {
  std::vector<server::ChatMessage> messages;
  bool add_generation_prompt = true;
};

std::vector<server::ChatMessage> parse_messages(const json& j, size_t at) {
  KESTREL_CHECK(j.is_array(), "conversation ", at, ": messages must be an array");
  std::vector<server::ChatMessage> out;
  for (const json& m : j) {
    KESTREL_CHECK(m.is_object() && m.contains("role") && m["role"].is_string() &&
                      m.contains("content") && m["content"].is_string(),
                  "conversation ", at, ": each message needs string role and content");
    out.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
  }
  return out;
}

// A messages array (one conversation), or an array of {"messages": [...],
// "add_generation_prompt": bool} objects.
std::vector<Conversation> read_conversations(const std::string& path) {
  std::ifstream in(path);
  KESTREL_CHECK(in.good(), "cannot read ", path);
  const json j = json::parse(in, nullptr, false);
  KESTREL_CHECK(!j.is_discarded() && j.is_array(), path, ": expected a JSON array");
  if (j.empty() || j[0].contains("role")) return {{parse_messages(j, 0), true}};
  std::vector<Conversation> out;
  for (size_t i = 0; i < j.size(); ++i) {
    KESTREL_CHECK(j[i].is_object() && j[i].contains("messages"), path, ": conversation ", i,
                  " needs \"messages\"");
    out.push_back({parse_messages(j[i]["messages"], i), j[i].value("add_generation_prompt", true)});
  }
  return out;
}

void run(const ChatTemplateArgs& a) {
  const server::ChatTemplate t = server::ChatTemplate::from_model_dir(a.model_dir);
  const std::vector<Conversation> convs = read_conversations(a.conversations);
  json rendered = json::array();
  for (const Conversation& c : convs) {
    std::string text;
    try {
      text = t.render(c.messages, c.add_generation_prompt);
    } catch (const Error& e) {  // raise_exception and the like: reported per conversation
      if (!a.json_out) throw;
      rendered.push_back({{"error", e.what()}});
      continue;
    }
    if (a.json_out)
      rendered.push_back(text);
    else
      std::fwrite(text.data(), 1, text.size(), stdout);
  }
  if (a.json_out) std::printf("%s\n", rendered.dump().c_str());
}

}  // namespace

void add_chat_template_command(CLI::App& app) {
  static ChatTemplateArgs a;
  CLI::App* cmd =
      app.add_subcommand("chat-template", "render conversations through a model's chat template");
  cmd->add_option("--model", a.model_dir, "model folder (its tokenizer_config.json)")->required();
  cmd->add_option("--conversations", a.conversations,
                  "JSON file: a messages array, or [{\"messages\": [...], "
                  "\"add_generation_prompt\": bool}, ...]")
      ->required();
  cmd->add_flag("--json", a.json_out,
                "print a JSON array of the rendered prompts (an error as {\"error\": ...})");
  cmd->callback([] { run(a); });
}

}  // namespace kestrel::cli
