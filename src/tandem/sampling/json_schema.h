// JSON Schema -> Grammar, for structured output (response_format json_schema, tool calls) and JSON mode.
//
// The grammar matches compact or lightly formatted JSON text (whitespace between tokens: nothing, one
// space, or a newline and up to 20 spaces or tabs of indentation). Supported keywords:
//   type (a name or a list of names), enum, const, anyOf, oneOf (treated as anyOf), allOf with one
//   schema, $ref to "#" or any JSON pointer into the document ($defs, definitions; recursion allowed);
//   object: properties (written in their declared order; the required ones always, the others optionally),
//   required, additionalProperties (false, true or a schema; absent means false when properties are
//   given, so the output holds only declared properties);
//   array: items, minItems, maxItems; string: minLength, maxLength (in code points), format date, time,
//   date-time and uuid (other formats are annotations and not enforced); integer: minimum, maximum,
//   exclusiveMinimum, exclusiveMaximum; number. Numbers are kept within what int64 and double hold: at
//   most 18 integer digits, 16 fraction digits and a two-digit exponent.
// Annotations (title, description, default, examples, $schema, $id, $comment, ...) are ignored. A keyword
// that would constrain the output but is not supported (pattern, multipleOf, uniqueItems, not, ...) is an
// error rather than silently unenforced. Extra property names (additionalProperties) are written in
// printable ASCII without escapes, and never equal a declared property's name.
//
// Errors throw tandem::Error naming the place in the schema as a JSON pointer ("#/properties/age/type")
// and what was expected there.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string_view>

#include "tandem/sampling/grammar.h"

namespace tandem::sampling {

// Parses `schema_text` as JSON (property order is kept) and compiles it.
Grammar grammar_from_json_schema(std::string_view schema_text);
// The same for a schema already parsed (with its property order kept).
Grammar grammar_from_parsed_json_schema(const nlohmann::ordered_json& schema);

// JSON mode: any JSON object.
Grammar json_object_grammar();

// For grammars that hold JSON values among other text (tool calls): adds to `builder` the rules of one value
// of `schema` and returns that value's rule. Errors throw as grammar_from_parsed_json_schema's. Finish with
// build_json_grammar(), which names a $ref cycle that writes no text as such.
int32_t add_json_schema_rules(GrammarBuilder& builder, const nlohmann::ordered_json& schema);
Grammar build_json_grammar(GrammarBuilder&& builder, int32_t root);

}  // namespace tandem::sampling
