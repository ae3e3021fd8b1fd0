// Structured output's request shapes, every dialect into one grammar::Spec (the engine checks
// and compiles it; docs/structured-output.md):
//   LoRAX   parameters.response_format = {"type": "json_object" | "json_schema", "schema": {...}}
//   TGI     parameters.grammar = {"type": "json" | "regex", "value": schema | "regex"}
//   OpenAI  response_format = {"type": "text" | "json_object"}
//           | {"type": "json_schema", "json_schema": {"name", "schema", "strict", ...}}
#pragma once

#include <optional>

#include "grammar/constraint.h"
#include "server/json_util.h"

namespace kestrel::server {

// LoRAX's parameters.response_format (OpenAI's nested json_schema.schema is read too).
std::optional<grammar::Spec> parse_lorax_response_format(const json& value);
// TGI's parameters.grammar.
std::optional<grammar::Spec> parse_tgi_grammar(const json& value);
// OpenAI's response_format ("text": none).
std::optional<grammar::Spec> parse_openai_response_format(const json& value);

// `json` keeps object keys sorted, but a schema's `properties` order is the order of the output:
// replaces spec's schema text by the client's own, read again from `body` at prefix + spec.field
// ("parameters." for LoRAX / TGI, "" for OpenAI).
void keep_schema_order(std::string_view body, const std::string& prefix, grammar::Spec& spec);

}  // namespace kestrel::server
