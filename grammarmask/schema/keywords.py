"""JSON Schema's vocabulary: the keywords that constrain an instance, and where subschemas
sit. Keywords outside it (`$id`, `title`, `x-...`, typos) are annotations or unknown, and
validators ignore them."""

from __future__ import annotations

VOCABULARY = frozenset(
    {
        "type", "enum", "const", "multipleOf", "maximum", "exclusiveMaximum", "minimum",
        "exclusiveMinimum", "maxLength", "minLength", "pattern", "format", "items",
        "additionalItems", "prefixItems", "contains", "minContains", "maxContains", "maxItems",
        "minItems", "uniqueItems", "maxProperties", "minProperties", "required", "properties",
        "patternProperties", "additionalProperties", "dependencies", "dependentRequired",
        "dependentSchemas", "propertyNames", "allOf", "anyOf", "oneOf", "not", "if", "then",
        "else", "unevaluatedItems", "unevaluatedProperties", "$ref", "$dynamicRef",
        "$recursiveRef",
    }
)  # fmt: skip
"""Keywords that can constrain an instance in some JSON Schema draft (4 to 2020-12)."""

COUNT_KEYWORDS = (
    "maxLength", "minLength", "maxItems", "minItems", "maxProperties", "minProperties",
    "maxContains", "minContains",
)  # fmt: skip
"""Keywords whose value is a count: `2.0` means 2 (JSON Schema's integers are mathematical)."""

SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
"""Keywords whose value maps names to subschemas."""
SUBSCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems")
"""Keywords whose value is a list of subschemas (and `items` when it is a list)."""
SUBSCHEMA_SINGLE = (
    "additionalProperties", "items", "additionalItems", "contains", "not", "if", "then", "else",
    "propertyNames", "unevaluatedItems", "unevaluatedProperties",
)  # fmt: skip
"""Keywords whose value is one subschema."""
