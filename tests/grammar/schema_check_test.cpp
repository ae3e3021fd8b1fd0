// check_json_schema: the schemas structured output accepts (each compiled by xgrammar here too),
// the ones it refuses (with the keyword and the JSON pointer in the message), and, for a few of
// those, proof that xgrammar 0.2.8 compiles them silently into a grammar that lets invalid JSON
// through, which is why they are refused.
#include "grammar/schema_check.h"

#include <gtest/gtest.h>
#include <xgrammar/xgrammar.h>

#include <string>

namespace kestrel::grammar {
namespace {

using nlohmann::json;

const std::string kField = "response_format.json_schema.schema";

// Accepted by the check, and compiled by xgrammar as kestrel compiles it.
void expect_accepted(const std::string& text) {
  SCOPED_TRACE(text);
  const json schema = json::parse(text);
  EXPECT_NO_THROW(check_json_schema(schema, kField));
  EXPECT_NO_THROW(xgrammar::Grammar::FromJSONSchema(schema.dump(), /*any_whitespace=*/false));
}

// Refused, with a message naming `keyword` (in backquotes) and `where` ("/properties/a", "the
// root"), and holding `detail` when given.
void expect_refused(const std::string& text, const std::string& keyword, const std::string& where,
                    const std::string& detail = "") {
  SCOPED_TRACE(text);
  try {
    check_json_schema(json::parse(text), kField);
    ADD_FAILURE() << "accepted";
  } catch (const ValidationError& e) {
    EXPECT_EQ(e.field(), kField);
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    const std::string message = e.what();
    EXPECT_NE(message.find("`" + keyword + "`"), std::string::npos) << message;
    EXPECT_NE(message.find(" at " + where), std::string::npos) << message;
    EXPECT_NE(message.find(detail), std::string::npos) << message;
  }
}

// Whether the grammar xgrammar compiles from `schema` (as kestrel compiles it, with ", " and ": "
// separators) accepts the JSON text `instance` in full.
bool xgrammar_accepts(const std::string& schema, const std::string& instance) {
  const auto grammar = xgrammar::Grammar::FromJSONSchema(schema, /*any_whitespace=*/false);
  xgrammar::GrammarCompiler compiler(xgrammar::TokenizerInfo({"a"}), /*max_threads=*/1,
                                     /*cache_enabled=*/false);
  xgrammar::GrammarMatcher matcher(compiler.CompileGrammar(grammar), std::nullopt,
                                   /*terminate_without_stop_token=*/true);
  return matcher.AcceptString(instance) && matcher.IsCompleted();
}

TEST(SchemaCheck, AcceptsObjectsWithRequiredAndOptionalProperties) {
  expect_accepted(R"({"type": "object", "title": "Person", "description": "d",
    "properties": {"name": {"type": "string", "minLength": 1, "maxLength": 40},
                   "age": {"type": "integer", "minimum": 0, "maximum": 150},
                   "address": {"type": "object", "additionalProperties": false,
                               "properties": {"city": {"type": "string"},
                                              "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                               "required": ["city"]}},
    "required": ["name", "address"], "additionalProperties": false})");
  expect_accepted(R"({"properties": {"a": {"type": "boolean"}, "b": {"type": "null"}}})");
  expect_accepted(R"({"type": "object", "properties": {"a": {}}, "minProperties": 1,
    "maxProperties": 1, "additionalProperties": {"type": "number"}})");
  expect_accepted(R"({"type": "object", "patternProperties": {"^x_[a-z]+$": {"type": "integer"}},
    "maxProperties": 3})");
  expect_accepted(R"({"type": "object", "propertyNames": {"pattern": "^[a-z]{1,8}$"},
    "additionalProperties": {"type": "string"}})");
  expect_accepted(R"({"type": "object", "propertyNames": {"enum": ["a", "b"]}})");
  expect_accepted(R"({"type": "object", "unevaluatedProperties": false,
    "properties": {"a": {"type": "string", "readOnly": true, "examples": ["x"]}}})");
}

TEST(SchemaCheck, AcceptsArrays) {
  expect_accepted(
      R"({"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 3})");
  expect_accepted(R"({"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}],
    "items": false, "minItems": 1})");
  expect_accepted(
      R"({"prefixItems": [{"type": "integer"}], "unevaluatedItems": {"type": "null"}})");
  expect_accepted(R"({"type": "array", "items": {"type": "array", "items": {"type": "number"}}})");
  expect_accepted(R"({"type": "array"})");
}

TEST(SchemaCheck, AcceptsScalars) {
  expect_accepted(R"({"type": "string", "enum": ["red", "green", "blue"]})");
  expect_accepted(R"({"enum": ["a", 1, null, true, {"k": [1]}]})");
  expect_accepted(R"({"type": "string", "const": "v1"})");
  expect_accepted(R"({"const": "a", "enum": ["a"], "type": "string"})");
  expect_accepted(R"({"type": "integer", "const": 2.0})");
  expect_accepted(R"({"type": "integer", "exclusiveMinimum": -5, "exclusiveMaximum": 5})");
  expect_accepted(R"({"type": "integer", "minimum": 1e3, "maximum": 2000})");
  expect_accepted(R"({"type": "integer", "multipleOf": 7})");
  expect_accepted(R"({"type": "integer", "multipleOf": 5, "minimum": 0, "maximum": 100})");
  expect_accepted(R"({"type": "number", "minimum": -1.5, "exclusiveMaximum": 2.25})");
  expect_accepted(R"({"type": "number", "minimum": 5, "maximum": 5})");
  expect_accepted(R"({"type": "string", "pattern": "^[A-Z]{3}-[0-9]+$"})");
  expect_accepted(R"({"type": "string", "pattern": "^[(?=]\\(?!$"})");  // no lookahead
  expect_accepted(R"({"type": "string", "maxLength": 10})");
  for (const char* format : {"time", "duration", "email", "uuid", "ipv6", "hostname", "uri",
                             "uri-reference", "uri-template"})
    expect_accepted(R"({"type": "string", "format": ")" + std::string(format) + "\"}");
  expect_accepted(R"({"type": ["string", "null"], "maxLength": 5})");
  expect_accepted(R"({"type": ["integer", "boolean"], "minimum": 0})");
  // A keyword of another type holds trivially (OpenAPI writes "format": "int32" on integers).
  expect_accepted(R"({"type": "integer", "format": "int32", "minLength": 2})");
  expect_accepted(R"({"type": "boolean", "default": false, "$comment": "c", "deprecated": true})");
  expect_accepted("{}");
  expect_accepted("true");
}

TEST(SchemaCheck, AcceptsAnyOfOneOfAndAllOf) {
  expect_accepted(R"({"anyOf": [{"type": "string"}, {"type": "null"}], "default": null})");
  expect_accepted(R"({"anyOf": [{"type": "object", "properties": {"a": {"type": "integer"}},
    "required": ["a"]}, {"type": "array", "items": {"type": "string"}}, true]})");
  expect_accepted(R"({"oneOf": [{"type": "string"}, {"type": ["integer", "null"]}]})");
  expect_accepted(R"({"oneOf": [{"const": "a"}, {"enum": ["b", "c"]}, {"type": "integer"}]})");
  expect_accepted(R"({"oneOf": [{"const": 1}, {"const": 2}]})");
  expect_accepted(R"({"allOf": [{"type": "string", "maxLength": 3}], "title": "t"})");
}

TEST(SchemaCheck, AcceptsRefs) {
  expect_accepted(R"({"$defs": {"Point": {"type": "object", "required": ["x", "y"],
    "properties": {"x": {"type": "number"}, "y": {"type": "number"}}}},
    "type": "array", "items": {"$ref": "#/$defs/Point"}})");
  expect_accepted(R"({"definitions": {"Id": {"type": "integer", "minimum": 1}},
    "$ref": "#/definitions/Id", "description": "an id"})");
  expect_accepted(R"({"properties": {"a": {"type": "string"}, "b": {"$ref": "#/properties/a"}}})");
  // Pydantic wraps a $ref that carries a description in a one-member allOf.
  expect_accepted(R"({"$defs": {"E": {"enum": ["x", "y"], "type": "string"}}, "type": "object",
    "properties": {"e": {"allOf": [{"$ref": "#/$defs/E"}], "description": "d"}}})");
  // Recursion through a real schema.
  expect_accepted(R"({"$defs": {"Node": {"type": "object", "required": ["value"],
    "properties": {"value": {"type": "integer"},
                   "children": {"type": "array", "items": {"$ref": "#/$defs/Node"}}}}},
    "$ref": "#/$defs/Node"})");
  expect_accepted(R"({"type": "object", "properties": {"v": {"type": "integer"},
    "next": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}}, "required": ["v"]})");
  expect_accepted(
      R"({"$id": "https://example.com/s", "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$defs": {"A": {"$ref": "#/$defs/B"}, "B": {"type": "string"}}, "$ref": "#/$defs/A"})");
}

TEST(SchemaCheck, RefusesKeywordsXgrammarIgnores) {
  const std::string message =
      "`uniqueItems` at /properties/tags is not supported by structured output (it would not be "
      "enforced)";
  try {
    check_json_schema(json::parse(R"({"type": "object", "properties": {"tags": {"type": "array",
      "items": {"type": "string"}, "uniqueItems": true}}})"),
                      kField);
    ADD_FAILURE() << "accepted";
  } catch (const ValidationError& e) {
    EXPECT_EQ(std::string(e.what()), message);
  }
  expect_refused(R"({"type": "string", "not": {"const": "x"}})", "not", "the root");
  expect_refused(R"({"type": "object", "properties": {"a": {"type": "integer"}},
    "if": {"required": ["a"]}, "then": {"required": ["b"]}})",
                 "if", "the root");
  expect_refused(R"({"type": "object", "then": {}})", "then", "the root");
  expect_refused(R"({"type": "object", "else": {}})", "else", "the root");
  expect_refused(R"({"type": "object", "properties": {"a": {}, "b": {}},
    "dependentRequired": {"a": ["b"]}})",
                 "dependentRequired", "the root");
  expect_refused(R"({"type": "object", "dependentSchemas": {"a": {}}})", "dependentSchemas",
                 "the root");
  expect_refused(R"({"type": "object", "dependencies": {"a": ["b"]}})", "dependencies", "the root");
  expect_refused(R"({"type": "array", "contains": {"const": 1}})", "contains", "the root");
  expect_refused(R"({"type": "array", "items": {}, "minContains": 2})", "minContains", "the root");
  expect_refused(R"({"type": "array", "items": {}, "maxContains": 2})", "maxContains", "the root");
  expect_refused(R"({"type": "string", "nullable": true})", "nullable", "the root");
  expect_refused(R"({"type": "string", "$anchor": "a"})", "$anchor", "the root");
  expect_refused(R"({"type": "object", "properties": {"a~b/c": {"type": "string",
    "contentEncoding": "base64"}}})",
                 "contentEncoding", "/properties/a~0b~1c");
  expect_refused(R"({"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "object",
    "properties": {"x": {"type": "integer", "multipleOf": 0.5}}}}]})",
                 "multipleOf", "/anyOf/1/items/properties/x");
}

TEST(SchemaCheck, RefusesCombinationsXgrammarDrops) {
  // Siblings of the branch xgrammar picks.
  expect_refused(R"({"type": "object", "properties": {"a": {"type": "string"}},
    "anyOf": [{"required": ["a"]}]})",
                 "properties", "the root", "next to `anyOf`");
  expect_refused(R"({"$defs": {"A": {"type": "integer"}}, "$ref": "#/$defs/A", "maximum": 3})",
                 "maximum", "the root", "next to `$ref`");
  expect_refused(R"({"type": "string", "minLength": 2, "enum": ["a", "bb"]})", "minLength",
                 "the root", "next to `enum`");
  expect_refused(R"({"const": "a", "enum": ["b"]})", "enum", "the root", "next to `const`");
  expect_refused(R"({"anyOf": [{"type": "string"}], "oneOf": [{"type": "string"}]})", "oneOf",
                 "the root", "next to `anyOf`");
  expect_refused(R"({"type": "integer", "const": "a"})", "const", "the root", "`type`");
  expect_refused(R"({"type": "string", "enum": ["a", 1]})", "enum", "the root", "`type`");
  // oneOf that xgrammar reads as anyOf, allOf of several members (any value at all).
  expect_refused(R"({"oneOf": [{"type": "integer"}, {"type": "number"}]})", "oneOf", "the root",
                 "anyOf");
  expect_refused(R"({"oneOf": [{"type": "string", "maxLength": 3}, {"type": "null"}]})", "oneOf",
                 "the root");
  expect_refused(R"({"oneOf": [{"type": "object"}, {"type": "null"}]})", "oneOf", "the root");
  expect_refused(R"({"oneOf": [{"enum": ["a", "b"]}, {"type": "string"}]})", "oneOf", "the root");
  expect_refused(R"({"oneOf": [{"const": 1}, {"const": 1.0}]})", "oneOf", "the root");
  expect_refused(R"({"oneOf": [{"type": "object", "required": ["kind"],
    "properties": {"kind": {"const": "a"}}}, {"type": "object", "required": ["kind"],
    "properties": {"kind": {"const": "b"}}}]})",
                 "oneOf", "the root");
  expect_refused(R"({"allOf": [{"type": "string"}, {"type": "string", "maxLength": 3}]})", "allOf",
                 "the root", "any value");
  // Strings.
  expect_refused(R"({"type": "string", "pattern": "^a+$", "maxLength": 3})", "maxLength",
                 "the root", "next to `pattern`");
  expect_refused(R"({"type": "string", "format": "email", "minLength": 5})", "minLength",
                 "the root", "next to `format`");
  expect_refused(R"({"type": "string", "format": "email", "pattern": "^2"})", "pattern", "the root",
                 "next to `format`");
  // Formats whose grammar is looser than the format.
  expect_refused(R"({"type": "string", "format": "date"})", "format", "the root", "02-31");
  expect_refused(R"({"type": "string", "format": "date-time"})", "format", "the root", "02-31");
  expect_refused(R"({"type": "string", "format": "ipv4"})", "format", "the root", "leading zeros");
  expect_refused(R"({"type": "string", "format": "int32"})", "format", "the root", "\"int32\"");
  expect_refused(R"({"type": "string", "format": "json-pointer"})", "format", "the root",
                 "invalid JSON");
  expect_refused(R"({"type": "string", "pattern": "^(?=.*[0-9])[a-z0-9]+$"})", "pattern",
                 "the root", "lookaround");
  expect_refused(R"j({"type": "object", "patternProperties": {"^(?!x)": {}}})j",
                 "patternProperties", "the root", "lookaround");
  // Pydantic's schema for a Decimal.
  expect_refused(R"j({"anyOf": [{"type": "number"}, {"type": "string",
    "pattern": "^(?!^[-+.]*$)[+-]?0*\\d*\\.?\\d*$"}]})j",
                 "pattern", "/anyOf/1", "lookaround");
  expect_refused(R"({"type": ["string", "null"], "format": "relative-json-pointer"})", "format",
                 "the root");
  // Numbers.
  expect_refused(R"({"type": "number", "multipleOf": 0.5})", "multipleOf", "the root", "number");
  expect_refused(R"({"type": ["integer", "number"], "multipleOf": 2})", "multipleOf", "the root");
  expect_refused(R"({"type": "integer", "multipleOf": 2048})", "multipleOf", "the root", "1024");
  expect_refused(R"({"type": "integer", "multipleOf": 3, "minimum": 0})", "multipleOf", "the root",
                 "10000");
  expect_refused(R"({"type": "integer", "multipleOf": 3, "minimum": 0, "maximum": 20000})",
                 "multipleOf", "the root", "10000");
  // Objects.
  expect_refused(R"({"type": "object", "properties": {"a": {}}, "required": ["a", "b"]})",
                 "required", "the root", "\"b\"");
  expect_refused(R"({"type": "object", "required": ["a"]})", "required", "the root");
  expect_refused(R"({"type": "object", "properties": {"a": {}},
    "patternProperties": {"^b": {}}})",
                 "patternProperties", "the root", "`properties`");
  expect_refused(R"({"type": "object", "patternProperties": {"^a": {}, "^b": {}}})",
                 "patternProperties", "the root");
  expect_refused(R"({"type": "object", "properties": {"abc": {}},
    "propertyNames": {"maxLength": 2}})",
                 "propertyNames", "the root", "`properties`");
  expect_refused(R"({"type": "object", "patternProperties": {"^a": {}},
    "propertyNames": {"maxLength": 2}})",
                 "propertyNames", "the root");
  expect_refused(R"({"type": "object", "propertyNames": {"maxLength": 2},
    "additionalProperties": false})",
                 "propertyNames", "the root");
  expect_refused(R"({"type": "object", "propertyNames": {"enum": ["a", 1]}})", "enum",
                 "/propertyNames", "not a string");
  expect_refused(R"({"type": "object", "propertyNames": {"type": ["string", "null"]}})", "type",
                 "/propertyNames");
  expect_refused(R"({"type": "object", "propertyNames": {"anyOf": [{"const": "a"}]}})", "anyOf",
                 "/propertyNames");
  // Keywords of a type xgrammar does not know the value to have.
  expect_refused(R"({"minLength": 3})", "minLength", "the root", "without a `type`");
  expect_refused(R"({"properties": {"a": {"minimum": 0}}})", "minimum", "/properties/a");
  expect_refused(R"({"patternProperties": {"^a": {}}})", "patternProperties", "the root");
  expect_refused(R"({"anyOf": [{"required": ["a"]}, {"required": ["b"]}]})", "required",
                 "/anyOf/0");
}

TEST(SchemaCheck, RefusesBadValues) {
  expect_refused(R"({"type": "int"})", "type", "the root");
  expect_refused(R"({"type": []})", "type", "the root");
  expect_refused(R"({"type": ["string", 1]})", "type", "the root");
  expect_refused(R"({"enum": []})", "enum", "the root");
  expect_refused(R"({"enum": "a"})", "enum", "the root");
  expect_refused(R"({"anyOf": {}})", "anyOf", "the root");
  expect_refused(R"({"anyOf": []})", "anyOf", "the root");
  expect_refused(R"({"oneOf": []})", "oneOf", "the root");
  expect_refused(R"({"allOf": []})", "allOf", "the root");
  expect_refused(R"({"type": "string", "minLength": "3"})", "minLength", "the root");
  expect_refused(R"({"type": "string", "minLength": -1})", "minLength", "the root");
  expect_refused(R"({"type": "string", "maxLength": 2.0})", "maxLength", "the root");
  expect_refused(R"({"type": "string", "minLength": 3000000000})", "minLength", "the root");
  expect_refused(R"({"type": "string", "pattern": 5})", "pattern", "the root");
  expect_refused(R"({"type": "string", "format": true})", "format", "the root");
  expect_refused(R"({"type": "integer", "minimum": "0"})", "minimum", "the root");
  expect_refused(R"({"type": "integer", "minimum": 0.5})", "minimum", "the root", "whole");
  expect_refused(R"({"type": "integer", "maximum": 1e19})", "maximum", "the root");
  expect_refused(R"({"type": "integer", "exclusiveMinimum": true})", "exclusiveMinimum",
                 "the root");
  expect_refused(R"({"type": "integer", "multipleOf": 0})", "multipleOf", "the root");
  expect_refused(R"({"type": "object", "properties": []})", "properties", "the root");
  expect_refused(R"({"type": "object", "properties": {"a": {}}, "required": "a"})", "required",
                 "the root");
  expect_refused(R"({"type": "object", "properties": {"a": {}}, "required": [1]})", "required",
                 "the root");
  expect_refused(R"({"type": "object", "additionalProperties": 1})", "additionalProperties",
                 "the root");
  expect_refused(R"({"type": "object", "propertyNames": true})", "propertyNames", "the root");
  expect_refused(R"({"type": "object", "minProperties": 1.5})", "minProperties", "the root");
  expect_refused(R"({"type": "array", "items": [{"type": "string"}]})", "items", "the root",
                 "prefixItems");
  expect_refused(R"({"type": "array", "prefixItems": [true]})", "prefixItems", "the root");
  expect_refused(R"({"type": "array", "maxItems": -1})", "maxItems", "the root");
  expect_refused(R"({"$defs": []})", "$defs", "the root");
  expect_refused(R"({"$ref": 1})", "$ref", "the root");
  try {
    check_json_schema(json::parse(R"({"properties": {"a": false}})"), kField);
    ADD_FAILURE() << "accepted";
  } catch (const ValidationError& e) {
    EXPECT_NE(std::string(e.what()).find("`false` at /properties/a"), std::string::npos);
  }
  EXPECT_THROW(check_json_schema(json::parse(R"({"items": 3})"), kField), ValidationError);
  EXPECT_THROW(check_json_schema(json::parse("[]"), kField), ValidationError);
  EXPECT_THROW(check_json_schema(json::parse("false"), kField), ValidationError);
}

TEST(SchemaCheck, RefusesUnsatisfiableBounds) {
  expect_refused(R"({"type": "integer", "minimum": 5, "maximum": 4})", "minimum", "the root");
  expect_refused(R"({"type": "integer", "exclusiveMinimum": 4, "exclusiveMaximum": 5})",
                 "exclusiveMinimum", "the root");
  expect_refused(R"({"type": "integer", "exclusiveMinimum": 9223372036854775807})",
                 "exclusiveMinimum", "the root");
  expect_refused(R"({"type": "number", "exclusiveMinimum": 1, "maximum": 1})", "exclusiveMinimum",
                 "the root");
  expect_refused(R"({"type": "number", "minimum": 0.1234561, "maximum": 0.1234569})", "minimum",
                 "the root", "6 decimals");
  expect_refused(R"({"type": "integer", "multipleOf": 10, "minimum": 1, "maximum": 9})",
                 "multipleOf", "the root");
  expect_refused(R"({"type": "string", "minLength": 3, "maxLength": 2})", "minLength", "the root");
  expect_refused(R"({"type": "array", "items": {}, "minItems": 3, "maxItems": 2})", "minItems",
                 "the root");
  expect_refused(R"({"type": "array", "prefixItems": [{}, {}], "maxItems": 1})", "maxItems",
                 "the root");
  expect_refused(R"({"type": "array", "prefixItems": [{}], "items": false, "minItems": 2})",
                 "minItems", "the root");
  // Strict mode: without `items` an array holds no items beyond prefixItems.
  expect_refused(R"({"type": "array", "minItems": 1})", "minItems", "the root");
  expect_refused(R"({"type": "object", "minProperties": 2, "maxProperties": 1})", "minProperties",
                 "the root");
  expect_refused(R"({"type": "object", "properties": {"a": {}, "b": {}}, "required": ["a", "b"],
    "maxProperties": 1})",
                 "maxProperties", "the root");
  expect_refused(R"({"type": "object", "properties": {"a": {}}, "minProperties": 2})",
                 "minProperties", "the root");
}

TEST(SchemaCheck, RefusesRefsOutsideTheDocument) {
  expect_refused(R"({"$ref": "https://example.com/schema.json"})", "$ref", "the root", "outside");
  expect_refused(R"({"$ref": "other.json#/$defs/A"})", "$ref", "the root");
  expect_refused(R"({"$defs": {"A": {}}, "$ref": "#a"})", "$ref", "the root");
  expect_refused(R"({"type": "object", "properties": {"a": {"$ref": "#/$defs/Missing"}}})", "$ref",
                 "/properties/a", "does not resolve");
  expect_refused(R"({"$defs": {"A": {}}, "$ref": "#/$defs/A/"})", "$ref", "the root");
  expect_refused(R"({"$defs": {"a/b": {}}, "$ref": "#/$defs/a~1b"})", "$ref", "the root",
                 "escapes");
  expect_refused(R"({"anyOf": [{}], "$ref": "#/anyOf/0"})", "anyOf", "the root");
  expect_refused(R"({"type": "array", "prefixItems": [{}], "items": {"$ref": "#/prefixItems/0"}})",
                 "$ref", "/items");
  // A $ref into a schema that is refused is refused there.
  expect_refused(R"({"$defs": {"A": {"type": "array", "uniqueItems": true}},
    "properties": {"a": {"$ref": "#/$defs/A"}}})",
                 "uniqueItems", "/$defs/A");
  // Bare $ref cycles describe nothing.
  expect_refused(R"({"$ref": "#"})", "$ref", "the root", "loops");
  expect_refused(R"({"$defs": {"A": {"$ref": "#/$defs/B"}, "B": {"$ref": "#/$defs/A"}},
    "type": "object", "properties": {"x": {"$ref": "#/$defs/A"}}})",
                 "$ref", "/$defs/");
  expect_refused(R"({"type": "object", "properties": {"a": {"type": "object",
    "$id": "https://example.com/a"}}})",
                 "$id", "/properties/a");
}

TEST(SchemaCheck, RefusesDeepNesting) {
  std::string deep = R"({"type": "string"})";
  for (int i = 0; i < 64; ++i) deep = R"({"type": "array", "items": )" + deep + "}";
  expect_accepted(deep);
  deep = R"({"type": "array", "items": )" + deep + "}";
  try {
    check_json_schema(json::parse(deep), kField);
    ADD_FAILURE() << "accepted";
  } catch (const ValidationError& e) {
    EXPECT_NE(std::string(e.what()).find("deeper than 64"), std::string::npos) << e.what();
    EXPECT_EQ(e.field(), kField);
  }
}

// What the refused schemas would do: xgrammar compiles each without a word and lets JSON through
// that the schema forbids.
TEST(SchemaCheck, XgrammarIgnoresWhatIsRefused) {
  EXPECT_TRUE(xgrammar_accepts(R"({"type": "array", "items": {"type": "integer"},
    "uniqueItems": true})",
                               "[1, 1]"));
  EXPECT_TRUE(xgrammar_accepts(R"({"type": "string", "not": {"const": "no"}})", R"("no")"));
  EXPECT_TRUE(xgrammar_accepts(R"({"type": "number", "multipleOf": 2})", "1.5"));
  EXPECT_TRUE(xgrammar_accepts(R"({"type": "integer", "multipleOf": 3, "minimum": 0})", "10"));
  EXPECT_TRUE(xgrammar_accepts(R"({"allOf": [{"type": "string"}, {"type": "integer"}]})", "[]"));
  EXPECT_TRUE(xgrammar_accepts(R"({"oneOf": [{"type": "integer"}, {"type": "number"}]})", "1"));
  EXPECT_TRUE(xgrammar_accepts(R"({"type": "object", "properties": {"a": {"type": "string"}},
    "anyOf": [{"required": ["a"]}]})",
                               R"({"a": 1})"));
  EXPECT_TRUE(
      xgrammar_accepts(R"({"type": "string", "pattern": "^a+$", "maxLength": 2})", R"("aaaa")"));
  EXPECT_TRUE(xgrammar_accepts(R"({"type": "object", "properties": {"a": {}},
    "required": ["a", "b"]})",
                               R"({"a": 1})"));
  EXPECT_TRUE(xgrammar_accepts(R"({"type": "string", "format": "int32"})", R"("x")"));
  EXPECT_TRUE(
      xgrammar_accepts(R"({"type": "string", "pattern": "^(?=.*[0-9])[a-z0-9]+$"})", R"("abc")"));
  EXPECT_TRUE(xgrammar_accepts(R"({"$ref": "https://example.com/s.json"})", "[true]"));
  EXPECT_TRUE(xgrammar_accepts(R"({"type": "object", "propertyNames": {"enum": ["a", 1]}})",
                               "{1: 2}"));  // not even JSON
  EXPECT_TRUE(xgrammar_accepts(R"({"type": "string", "format": "json-pointer"})",
                               R"("/a"b")"));  // nor this
  // And what the accepted ones do.
  EXPECT_FALSE(xgrammar_accepts(R"({"type": "integer", "multipleOf": 3})", "10"));
  EXPECT_FALSE(xgrammar_accepts(R"({"oneOf": [{"type": "string"}, {"type": "null"}]})", "1"));
  EXPECT_FALSE(xgrammar_accepts(R"({"type": ["string", "null"], "maxLength": 2})", R"("abc")"));
}

}  // namespace
}  // namespace kestrel::grammar
