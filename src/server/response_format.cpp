// Structured output's request shapes into grammar::Spec; the schema's own rules are checked by
// the engine's compiler (grammar/schema_check.h), which names the keyword at fault.
#include "server/response_format.h"

#include "core/error.h"

namespace kestrel::server {
namespace {

[[noreturn]] void invalid(const std::string& field, const std::string& message) {
  throw ValidationError(field, message);
}

std::string type_of(const json& obj, const std::string& field) {
  auto it = obj.find("type");
  if (it == obj.end() || !it->is_string()) invalid(field, "`" + field + ".type` must be a string");
  return it->get<std::string>();
}

grammar::Spec schema_spec(const json& schema, const std::string& field) {
  if (!schema.is_object() && !schema.is_boolean())
    invalid(field, "`" + field + "` must be a JSON Schema object, got " + schema.type_name());
  return {grammar::Spec::Kind::kJsonSchema, schema.dump(), field};
}

}  // namespace

std::optional<grammar::Spec> parse_lorax_response_format(const json& value) {
  const std::string f = "response_format";
  if (value.is_null()) return std::nullopt;
  if (!value.is_object()) invalid(f, "`response_format` must be an object");
  const std::string type = type_of(value, f);
  const json* schema = nullptr;
  std::string where = f + ".schema";
  if (auto it = value.find("schema"); it != value.end() && !it->is_null()) schema = &*it;
  if (auto js = value.find("json_schema"); !schema && js != value.end() && js->is_object()) {
    if (auto it = js->find("schema"); it != js->end() && !it->is_null()) {
      schema = &*it;
      where = f + ".json_schema.schema";
    }
  }
  if (type == "text") return std::nullopt;
  if (type == "json_object") {
    if (schema) return schema_spec(*schema, where);
    return grammar::Spec{grammar::Spec::Kind::kJsonObject, "", f};
  }
  if (type == "json_schema") {
    if (!schema) invalid(f + ".schema", "`response_format.schema` is required for json_schema");
    return schema_spec(*schema, where);
  }
  invalid(f + ".type", "`response_format.type` must be \"json_object\" or \"json_schema\", got \"" +
                           type + "\"");
}

std::optional<grammar::Spec> parse_tgi_grammar(const json& value) {
  const std::string f = "grammar";
  if (value.is_null()) return std::nullopt;
  if (!value.is_object()) invalid(f, "`grammar` must be an object {\"type\", \"value\"}");
  const std::string type = type_of(value, f);
  auto v = value.find("value");
  if (v == value.end() || v->is_null()) invalid(f + ".value", "`grammar.value` is required");
  if (type == "json" || type == "json_schema") {
    if (v->is_string()) {  // a schema sent as its JSON text
      json parsed = json::parse(v->get<std::string>(), nullptr, /*allow_exceptions=*/false);
      if (parsed.is_discarded()) invalid(f + ".value", "`grammar.value` is not valid JSON");
      return schema_spec(parsed, f + ".value");
    }
    return schema_spec(*v, f + ".value");
  }
  if (type == "regex") {
    if (!v->is_string()) invalid(f + ".value", "`grammar.value` must be a string for regex");
    if (v->get_ref<const std::string&>().empty())
      invalid(f + ".value", "`grammar.value` must not be an empty regex");
    return grammar::Spec{grammar::Spec::Kind::kRegex, v->get<std::string>(), f + ".value"};
  }
  invalid(f + ".type", "`grammar.type` must be \"json\" or \"regex\", got \"" + type + "\"");
}

std::optional<grammar::Spec> parse_openai_response_format(const json& value) {
  const std::string f = "response_format";
  if (value.is_null()) return std::nullopt;
  if (!value.is_object()) invalid(f, "`response_format` must be an object");
  const std::string type = type_of(value, f);
  if (type == "text") return std::nullopt;
  if (type == "json_object") return grammar::Spec{grammar::Spec::Kind::kJsonObject, "", f};
  if (type == "json_schema") {
    auto js = value.find("json_schema");
    if (js == value.end() || !js->is_object())
      invalid(f + ".json_schema", "`response_format.json_schema` must be an object");
    auto schema = js->find("schema");
    if (schema == js->end() || schema->is_null())
      invalid(f + ".json_schema.schema", "`response_format.json_schema.schema` is required");
    return schema_spec(*schema, f + ".json_schema.schema");
  }
  invalid(f + ".type",
          "`response_format.type` must be \"text\", \"json_object\" or "
          "\"json_schema\", got \"" +
              type + "\"");
}

void keep_schema_order(std::string_view body, const std::string& prefix, grammar::Spec& spec) {
  if (spec.kind != grammar::Spec::Kind::kJsonSchema) return;
  // The body parsed before (size and depth bounded); ordered_json keeps the client's key order.
  const nlohmann::ordered_json doc = nlohmann::ordered_json::parse(body, nullptr, false);
  const nlohmann::ordered_json* node = &doc;
  std::string path = prefix + spec.field;
  for (size_t at = 0; node && at <= path.size();) {
    const size_t dot = std::min(path.find('.', at), path.size());
    const std::string key = path.substr(at, dot - at);
    auto it = node->is_object() ? node->find(key) : node->end();
    node = node->is_object() && it != node->end() ? &*it : nullptr;
    at = dot + 1;
  }
  if (!node) return;        // not where the field says: keep the sorted text
  if (node->is_string()) {  // TGI's schema as JSON text
    const auto inner = nlohmann::ordered_json::parse(node->get<std::string>(), nullptr, false);
    if (!inner.is_discarded()) spec.text = inner.dump();
  } else {
    spec.text = node->dump();
  }
}

}  // namespace kestrel::server
