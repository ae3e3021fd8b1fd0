// Structured output: refuses a JSON Schema that xgrammar 0.2.8 would not enforce in full, before
// it is compiled, because xgrammar drops what it does not support (with at most a log warning) and
// the model is then free to write JSON that the schema forbids.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace kestrel::grammar {

// Throws ValidationError(field, message) when `schema` is not a JSON Schema kestrel enforces in
// full: a keyword (or a combination of keywords) that xgrammar 0.2.8 would not enforce, a keyword
// whose value has the wrong JSON type, a $ref that does not resolve inside the document, an
// unsatisfiable bound. The message names the keyword and the JSON pointer of the schema holding it,
// e.g.
// "`uniqueItems` at /properties/tags is not supported by structured output (it would not be
// enforced)".
//
// The rules follow xgrammar's SchemaParser::Parse, which reads one branch of a schema and ignores
// the keywords of the others, in this order: $ref > const > enum > anyOf > oneOf > allOf > type >
// (properties, additionalProperties, unevaluatedProperties: an object) > (items, prefixItems,
// unevaluatedItems: an array) > any value. So:
// - Next to $ref, anyOf, oneOf and allOf only annotations and $defs/definitions may stand. Next to
//   const and enum also `type`, when every value has that type (and, for const, an `enum` that
//   holds it).
// - A keyword of a type the value cannot have is skipped, as JSON Schema says ("format": "int32"
//   on an integer); one of a type xgrammar does not know the value to have (`minLength` without
//   `type`) is refused. Unknown keywords, and those xgrammar never enforces (not, if/then/else,
//   dependent*, dependencies, uniqueItems, contains, min/maxContains, ...), are refused anywhere.
// - oneOf is accepted only where xgrammar proves its branches exclusive by its first proof (every
//   branch a const, an enum, or a non-object `type` with annotations only, pairwise disjoint);
//   elsewhere xgrammar silently reads it as anyOf. Its second proof (objects that all require one
//   property with disjoint const/enum values) is left out: such a oneOf is refused, and anyOf,
//   which means the same for exclusive branches, accepted. allOf is accepted with one member only:
//   with several, xgrammar accepts any value.
// - multipleOf holds for integers only: whole, at most 1024, with both bounds or none, within a
//   range of at most 10000 values. minLength/maxLength do not hold next to pattern or format, nor
//   pattern next to format; `format` must be one xgrammar builds in, except json-pointer and
//   relative-json-pointer, whose grammars can write unescaped quotes, and date, date-time and
//   ipv4, whose grammars allow impossible dates (02-31) and leading zeros. A `pattern` (or a
//   patternProperties key) may not hold a lookaround, which xgrammar drops.
// - `required` may name only `properties`; patternProperties and propertyNames hold only without
//   `properties` (and not together); propertyNames must describe strings.
// - $ref must be "#" or "#/..." through object keys, without ~ or % escapes (xgrammar decodes
//   none), and not a cycle of bare $refs; recursion through a real schema is accepted. A nested
//   $id, which would change what a $ref means, is refused.
// - kestrel compiles with xgrammar's strict mode (FromJSONSchema's default), where a missing
//   `items` or `additionalProperties` allows none: minItems/minProperties beyond what is described
//   are refused, as xgrammar would.
// Schemas nest at most 64 levels (counting each $ref followed).
void check_json_schema(const nlohmann::json& schema, const std::string& field);

// Whether a regex holds a lookaround ("(?=", "(?!", "(?<=", "(?<!" outside a character class),
// which xgrammar's regex automaton drops with a warning: refused in `pattern` and regex
// constraints.
bool has_lookaround(const std::string& re);

}  // namespace kestrel::grammar
