"""Schema lowering: every rewrite keeps jsonschema's verdict on every instance, and the
backends enforce what it produces.

The verdicts are jsonschema's, under each schema's own draft with formats checked: the
original under the draft it names, the lowered schema under 2020-12.
"""

from __future__ import annotations

import copy
import functools
import json
import re
from datetime import date
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from conftest import SCHEMAS
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis_jsonschema import from_schema

import grammarmask as gm
from grammarmask.errors import SchemaJudgeError
from grammarmask.resources import bundled_sample_dir
from grammarmask.schema import lower_schema
from grammarmask.schema.lowering.disjoint import FORMAT_SUPERSETS, included
from grammarmask.schema.lowering.reading import Reading, joined
from grammarmask.schema.pointers import references
from grammarmask.tools.conformance import byte_token_ids, feed, validates

DRAFT4 = "http://json-schema.org/draft-04/schema#"
DRAFT7 = "http://json-schema.org/draft-07/schema#"

GRID = {"type": "object", "properties": {"h": {"type": "number"}}, "additionalProperties": False}
"""A closed object: its `not` has no positive form."""


def _recursive_node(name: str, child: dict[str, Any]) -> dict[str, Any]:
    """An object whose property `name` is `child`, which refers back to the object."""
    return {"type": "object", "properties": {name: child, "b": {"type": "integer"}}}


CASES: dict[str, Any] = {
    "integer-valued counts": {
        "type": "object",
        "properties": {"a": {"type": "array", "maxItems": 2.0, "minItems": 1.0}},
        "maxProperties": 1.0,
        "required": ["a"],
    },
    "string counts": {"type": "string", "minLength": 1.0, "maxLength": 3.0},
    "date": {"type": "string", "format": "date"},
    "date-time": {"type": "string", "format": "date-time"},
    "time": {"type": "string", "format": "time"},
    "date beside a length": {"type": "string", "format": "date", "maxLength": 12},
    "a format no draft defines": {"type": "string", "format": "color", "maxLength": 4},
    "draft-4 date (not a draft-4 format)": {"$schema": DRAFT4, "format": "date"},
    "draft-4 exclusive bounds": {
        "$schema": DRAFT4,
        "type": "number",
        "maximum": 3,
        "exclusiveMaximum": True,
        "minimum": 0,
        "exclusiveMinimum": False,
    },
    "draft-4 const is unknown": {"$schema": DRAFT4, "const": 3},
    "draft-7 tuple": {
        "$schema": DRAFT7,
        "type": "array",
        "items": [{"type": "integer"}, {"type": "string"}],
        "additionalItems": {"type": "boolean"},
    },
    "draft-7 closed tuple": {
        "$schema": DRAFT7,
        "items": [{"const": 1}],
        "additionalItems": False,
    },
    "draft-7 additionalItems alone": {"$schema": DRAFT7, "additionalItems": False},
    "draft-7 dependencies": {
        "$schema": DRAFT7,
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
        "dependencies": {"a": ["b"], "b": {"properties": {"c": {"const": 1}}, "required": ["c"]}},
    },
    "draft-7 if/then/else": {
        "$schema": DRAFT7,
        "if": {"type": "integer"},
        "then": {"minimum": 2},
        "else": {"type": "string"},
    },
    "draft-4 subschema ids without a $ref": {
        "$schema": DRAFT4,
        "id": "https://example.com/root",
        "type": "array",
        "items": [{"id": "https://example.com/root/0", "type": "integer"}],
        "additionalItems": False,
    },
    "oneOf of a pattern and values it refuses": {
        "oneOf": [
            {"type": "string", "pattern": "^[a-f]{2}$"},
            {"type": "string", "enum": ["", "x"]},
            {"type": "null"},
        ]
    },
    "oneOf of a pattern and a value it takes": {
        "oneOf": [{"type": "string", "pattern": "^[a-f]{2}$"}, {"enum": ["ab", "x"]}]
    },
    "oneOf beside a branch of unknown keywords": {
        "oneOf": [{"_format": "date-time", "title": "t"}, {"enum": ["a", "b"]}]
    },
    "anchor references": {
        "$defs": {"n": {"$anchor": "n", "type": "integer", "maximum": 3}},
        "type": "object",
        "properties": {"a": {"$ref": "#n"}, "b": {"anyOf": [{"$ref": "#n"}, {"type": "string"}]}},
    },
    "draft-4 id anchor references": {
        "$schema": DRAFT4,
        "definitions": {"n": {"id": "#n", "type": "integer", "maximum": 3}},
        "type": "object",
        "properties": {"a": {"$ref": "#n"}},
    },
    "an anchor beside an embedded resource is kept": {
        "$defs": {
            "e": {"$id": "https://example.com/e", "$defs": {"n": {"$anchor": "n"}}},
            "n": {"$anchor": "n", "type": "integer"},
        },
        "properties": {"a": {"$ref": "#n"}},
    },
    "draft-4 integer, read strictly": {
        "$schema": DRAFT4,
        "type": "integer",
        "maxItems": 1.0,
        "format": "date",
    },
    "draft-7 keywords beside $ref": {
        "$schema": DRAFT7,
        "definitions": {"n": {"type": "integer"}},
        "properties": {"x": {"$ref": "#/definitions/n", "maximum": 3}},
    },
    "2020-12 dependentRequired": {
        "dependentRequired": {"a": ["b", "c"]},
        "properties": {"a": {"type": "integer"}},
    },
    "2020-12 ignores dependencies": {"dependencies": {"a": ["b"]}},
    "not required": {"not": {"required": ["a", "b"]}},
    "not type": {"not": {"type": ["string", "null"]}},
    "not integer is kept": {"not": {"type": "integer"}},
    "not anyOf required": {"not": {"anyOf": [{"required": ["a"]}, {"required": ["b"]}]}},
    "not not": {"not": {"not": {"type": "string"}}},
    "not nothing": {"type": "object", "not": {}},
    "oneOf of types": {"oneOf": [{"type": "string"}, {"type": "integer"}, {"type": "null"}]},
    "oneOf integer and number is kept": {"oneOf": [{"type": "integer"}, {"type": "number"}]},
    "oneOf of consts": {"oneOf": [{"const": 1}, {"const": 1.5}, {"enum": ["a", 2]}]},
    "oneOf of equal consts (no instance)": {"oneOf": [{"const": 1}, {"const": 1.0}]},
    "oneOf on a discriminator": {
        "$defs": {
            "cat": {
                "type": "object",
                "properties": {"kind": {"const": "cat"}, "lives": {"type": "integer"}},
                "required": ["kind"],
            },
        },
        "oneOf": [
            {"$ref": "#/$defs/cat"},
            {
                "type": "object",
                "properties": {"kind": {"enum": ["dog", "wolf"]}},
                "required": ["kind"],
            },
        ],
    },
    "oneOf without the object type, on a required discriminator": {
        "oneOf": [
            {"properties": {"k": {"const": 1}}, "required": ["k"]},
            {"properties": {"k": {"const": 2}}, "required": ["k"]},
        ]
    },
    "oneOf of required sets": {
        "oneOf": [{"required": ["a"]}, {"required": ["b"]}, {"required": ["c", "a"]}],
    },
    "oneOf on a discriminator the siblings require": {
        "type": "object",
        "required": ["kind"],
        "oneOf": [
            {"properties": {"kind": {"const": "cat"}, "lives": {"type": "integer"}}},
            {"properties": {"kind": {"enum": ["dog", 1]}}},
        ],
    },
    "oneOf where a required key is one the other closes out": {
        "oneOf": [
            {"type": "object", "required": ["a"], "properties": {"a": {}}},
            {"type": "object", "properties": {"b": {}}, "additionalProperties": False},
            {
                "type": "object",
                "required": ["c"],
                "patternProperties": {"^[bc]$": {}},
                "additionalProperties": False,
            },
        ],
    },
    "oneOf of string lengths": {"type": "string", "oneOf": [{"maxLength": 0}, {"minLength": 1}]},
    "oneOf of number intervals": {
        "oneOf": [
            {"type": "number", "exclusiveMaximum": 2},
            {"type": "integer", "minimum": 2, "maximum": 3},
            {"type": "number", "exclusiveMinimum": 3},
        ],
    },
    "oneOf of touching bounds": {
        "oneOf": [{"type": "integer", "maximum": 2}, {"type": "integer", "minimum": 2}],
    },
    "oneOf of open objects where each branch settles the shared property": {
        "oneOf": [
            {"properties": {"events": {"type": "array", "items": {"enum": ["a", "b"]}}}},
            {"properties": {"events": {"enum": ["a", "b"]}}},
        ],
    },
    "oneOf of closed objects that share a property with no positive not": {
        "type": "array",
        "items": {
            "oneOf": [
                {
                    "type": "object",
                    "properties": {"kind": {"enum": [kind]}, "grid": GRID, **extra},
                    "additionalProperties": False,
                }
                for kind, extra in (("x", {"x": {"type": "integer"}}), ("y", {}))
            ],
        },
    },
    "oneOf of arrays whose items come from lists apart": {
        "oneOf": [
            {"type": "array", "maxItems": 3, "items": {"enum": ["a", "b"]}},
            {"type": "array", "items": {"enum": ["c", 1]}},
        ],
    },
    "oneOf of array counts": {
        "type": "array",
        "oneOf": [{"maxItems": 1}, {"minItems": 2, "items": {"type": "string"}}],
    },
    "oneOf of a schema and its not": {
        "oneOf": [{"multipleOf": 2}, {"not": {"multipleOf": 2}}],
    },
    "oneOf of anyOf branches of other kinds": {
        "oneOf": [{"anyOf": [{"type": "string"}, {"enum": [1, None]}]}, {"type": "object"}],
    },
    "oneOf of true and not 1": {"oneOf": [{"const": True}, {"not": {"const": 1}}]},
    "oneOf of object-only branches on a discriminator": {
        "oneOf": [
            {
                "properties": {"kind": {"enum": ["cat"]}, "lives": {}},
                "required": ["kind", "lives"],
                "additionalProperties": False,
            },
            {"properties": {"kind": {"enum": ["dog"]}}, "required": ["kind"]},
        ],
    },
    "oneOf where the other branch requires the discriminator": {
        "oneOf": [
            {"properties": {"op": {"enum": ["or"]}}, "required": ["v"]},
            {"properties": {"op": {"enum": ["eq"]}}, "required": ["op"]},
        ],
    },
    "oneOf of literal patterns": {
        "type": "object",
        "required": ["status"],
        "oneOf": [
            {"properties": {"status": {"type": "string", "pattern": "^ok$"}}},
            {"properties": {"status": {"type": "string", "pattern": "^fail$"}}},
        ],
    },
    "oneOf of arrays by their first item": {
        "type": "array",
        "oneOf": [
            {"minItems": 1, "items": {"type": "string"}},
            {"minItems": 2, "prefixItems": [{"type": "integer"}]},
        ],
    },
    "oneOf of arrays that may be empty": {
        "oneOf": [
            {"type": "array", "items": {"type": "string"}},
            {"type": "array", "items": {"type": "integer"}},
        ],
    },
    "oneOf of open objects, each without the others": {
        "oneOf": [
            {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]},
            {"type": "object", "properties": {"b": {"type": "string"}}, "required": ["b"]},
            {"type": "string", "maxLength": 1},
        ],
    },
    "oneOf of overlapping types": {
        "oneOf": [{"type": ["string", "null"]}, {"type": ["null", "boolean"]}, {"const": "a"}],
    },
    "oneOf with a branch that accepts everything": {"oneOf": [{"type": "number"}, {}]},
    "not of a deep nesting": {
        "not": functools.reduce(
            lambda inner, key: {key: [inner, {"required": ["x"]}]},
            ["anyOf", "allOf"] * 6,
            {"type": "string"},
        )
    },
    "not of string lengths": {"not": {"type": "string", "minLength": 2, "maxLength": 3}},
    "not of number bounds": {"not": {"minimum": 1, "exclusiveMaximum": 3, "title": "t"}},
    "not of counts": {"not": {"anyOf": [{"minItems": 1}, {"maxProperties": 1}]}},
    "not of a zero count": {"not": {"minLength": 0}},
    "oneOf of overlapping ranges": {"type": "number", "oneOf": [{"maximum": 2}, {"maximum": 3}]},
    "oneOf whose not has no positive form is kept": {
        "oneOf": [{"pattern": "a(?=b)"}, {"type": "string"}],
    },
    "oneOf of a pattern and every string": {"oneOf": [{"pattern": "^a"}, {"type": "string"}]},
    "oneOf of object-only branches sharing an object": {
        "oneOf": [{"properties": {"a": {"type": "string"}}}, {"properties": {"b": {}}}],
    },
    "not through $ref": {
        "$defs": {"r": {"required": ["a"]}, "s": {"type": "string"}},
        "not": {"anyOf": [{"$ref": "#/$defs/r"}, {"$ref": "#/$defs/s"}]},
    },
    "not not through $ref is kept": {
        "$defs": {"n": {"not": {"type": "string"}}},
        "not": {"$ref": "#/$defs/n"},
    },
    "a $ref into a rewritten oneOf keeps it in place": {
        "oneOf": [{"type": "string", "format": "date"}, {"type": "integer"}],
        "properties": {"x": {"$ref": "#/oneOf/0"}},
    },
    "not enum": {"not": {"enum": ["a", "ab", "", 1, 2.5, None, True]}},
    "not const string": {"type": "string", "not": {"const": "x"}},
    "not const with a newline is kept": {"not": {"const": "a\n"}},
    "oneOf of required sets, one inside another": {
        "oneOf": [{"required": ["a"]}, {"required": ["a", "b"]}, {"required": ["c"]}],
    },
    "if/then/else on a discriminator": {
        "type": "object",
        "properties": {"kind": {"type": "string"}, "x": {}},
        "if": {"properties": {"kind": {"const": "a"}}, "required": ["kind"]},
        "then": {"required": ["x"]},
        "else": {"properties": {"x": {"type": "integer"}}},
    },
    "if without else": {"if": {"type": "integer"}, "then": {"minimum": 2}},
    "if that has no positive not is kept": {"if": {"multipleOf": 2}, "then": {"minimum": 2}},
    "a decimal step of two fraction digits": {"type": "number", "multipleOf": 0.25},
    "a decimal step of three fraction digits beside integers": {
        "type": ["integer", "string"],
        "multipleOf": 0.125,
        "maximum": 3,
    },
    "a decimal step of three fraction digits": {"multipleOf": 0.375, "minimum": -1},
    "if whose then is empty and else absent": {
        "type": "object",
        "properties": {"kind": {"type": "string"}},
        "if": {"properties": {"kind": {"const": "array"}}},
        "then": {},
    },
    "if whose then and else are the same": {
        "if": {"multipleOf": 2},
        "then": {"minimum": 2},
        "else": {"minimum": 2},
    },
    "not of properties": {"not": {"properties": {"a": {"type": "string"}, "b": False}}},
    "not of several keywords": {"not": {"type": "object", "required": ["a"]}},
    "dependency of a required property": {
        "type": "object",
        "required": ["a"],
        "dependentRequired": {"a": ["b"], "c": ["a"]},
    },
    "draft-4 oneOf on consts is kept": {
        "$schema": DRAFT4,
        "oneOf": [{"const": 1}, {"const": 2}],
    },
    "a list beside a not": {"allOf": [{"enum": [1, 2, 3, "a"]}, {"not": {"multipleOf": 2}}]},
    "a list beside a pattern": {"enum": ["ab", "b", 3], "pattern": "^a", "title": "t"},
    "a list that nothing passes": {"const": "a", "minLength": 2},
    "a list of objects beside a oneOf": {
        "enum": [{"a": 1}, {"b": "x"}, {"a": 1, "b": "x"}],
        "oneOf": [{"required": ["a"]}, {"required": ["b"]}],
    },
    "a plain list is left": {"type": "string", "enum": ["a", "b"]},
    "a list beside a $ref at the root": {
        "$defs": {"n": {"minimum": 2}},
        "enum": [1, 2],
        "allOf": [{"$ref": "#/$defs/n"}],
    },
    "a list beside a $ref into a not not at the root": {
        "allOf": [
            {"enum": [{"a": False}, {"a": {}}, {"b": 1}, {"c": 1}]},
            {
                "not": {
                    "not": {
                        "additionalProperties": False,
                        "properties": {
                            "a": {"$ref": "#/allOf/1/not/not/properties/b"},
                            "b": {"type": "object"},
                        },
                    }
                }
            },
        ]
    },
    "oneOf whose branches require keys a shared not forbids together": {
        "$defs": {
            "common": {
                "type": "object",
                "required": ["id"],
                "not": {"required": ["result", "error"]},
            }
        },
        "oneOf": [
            {"allOf": [{"$ref": "#/$defs/common"}, {"required": ["result"]}]},
            {"allOf": [{"$ref": "#/$defs/common"}, {"required": ["error"]}]},
        ],
    },
    "oneOf whose branches require keys a not forbids only one of": {
        "$defs": {"common": {"type": "object", "not": {"required": ["result", "error", "x"]}}},
        "oneOf": [
            {"allOf": [{"$ref": "#/$defs/common"}, {"required": ["result"]}]},
            {"allOf": [{"$ref": "#/$defs/common"}, {"required": ["error"]}]},
        ],
    },
    "oneOf of arrays whose branches carry an id annotation": {
        "oneOf": [
            {"id": "first", "type": "array", "items": {"enum": ["x"]}, "maxItems": 2},
            {"id": "second", "type": "array", "items": {"enum": ["y"]}, "maxItems": 2},
        ]
    },
    "not of propertyNames false": {"not": {"propertyNames": False}},
    "not of propertyNames that refuse a name": {"not": {"propertyNames": {"not": {"const": "a"}}}},
    "not of propertyNames that refuse names": {
        "type": "object",
        "not": {"propertyNames": {"not": {"enum": ["a", "c"]}}},
    },
    "date-time beside a pattern": {"type": "string", "format": "date-time", "pattern": "Z$"},
    "minProperties 1 beside optional properties": {
        "type": "object",
        "properties": {"a": {"type": "string"}, "b": {}},
        "minProperties": 1,
    },
    "minProperties that the required properties meet": {
        "properties": {"a": {}, "b": {}, "c": {}},
        "required": ["a", "b"],
        "minProperties": 2,
    },
    "minProperties the required properties do not meet is kept": {
        "properties": {"a": {}, "b": {}},
        "required": ["a"],
        "minProperties": 2,
    },
    "listed integral decimals": {"enum": [2.0, "x", 1, {"a": [0.0, True]}, -3.0]},
    "a const integral decimal in an object": {"const": {"a": 1.0, "b": [2]}},
    "a list beside a $ref below the root is kept": {
        "$defs": {"n": {"minimum": 2}},
        "properties": {"p": {"enum": [1, 2], "allOf": [{"$ref": "#/$defs/n"}]}},
    },
    "oneOf of closed objects sharing the empty object": {
        "type": "object",
        "oneOf": [
            {"additionalProperties": False, "properties": {"a": {"type": "string"}}},
            {"additionalProperties": False, "properties": {"b": {"type": "string"}}},
        ],
    },
    "oneOf of closed objects sharing a property": {
        "oneOf": [
            {
                "type": "object",
                "additionalProperties": False,
                "properties": {"a": {"type": "string"}, "b": {}},
                "required": ["a"],
            },
            {"additionalProperties": False, "properties": {"a": {"maxLength": 2}, "c": {}}},
        ],
    },
    "uniqueItems of listed items": {
        "type": "array",
        "items": {"enum": [1, 2, "a"]},
        "uniqueItems": True,
        "minItems": 1,
    },
    "uniqueItems of booleans": {"type": "array", "items": {"type": "boolean"}, "uniqueItems": True},
    "uniqueItems of equal listed items is kept": {
        "type": "array",
        "items": {"enum": [1, 1.0]},
        "uniqueItems": True,
    },
    "uniqueItems of open items is kept": {"type": "array", "uniqueItems": True},
    "not of a pattern": {"type": "string", "not": {"pattern": "^a"}},
    "not of an unanchored pattern, any type": {"not": {"pattern": "b$"}},
    "not of a lookahead is kept": {"type": "string", "not": {"pattern": "a(?=b)"}},
    "not of a leading lookahead": {"type": "string", "not": {"pattern": "^(?=a)"}},
    "a leading negative lookahead": {"type": "string", "pattern": "^(?!ab|b$).+$"},
    "leading lookaheads on any type": {"pattern": "^(?=a)(?!abc)"},
    "a pattern with an end anchor inside": {"type": "string", "pattern": "^(/?(a|b*)($|/))*$"},
    "a pattern with a start anchor inside, any type": {"pattern": "(^a|b)c"},
    "a pattern with a word boundary is kept": {"type": "string", "pattern": "\\bab"},
    "a name pattern with a leading lookahead": {
        "type": "object",
        "patternProperties": {"^(?!ab|c$).+$": {"type": "integer"}},
        "additionalProperties": {"type": "string"},
    },
    "a name pattern with an anchor inside": {
        "patternProperties": {"^(a|$)b": {"type": "integer"}},
        "additionalProperties": False,
    },
    "a draft-7 tuple behind a $ref to a key no keyword names": {
        "$schema": DRAFT7,
        "$ref": "#/definitions/g/full",
        "definitions": {
            "g": {
                "full": {"type": "array", "items": [{"type": "integer"}], "additionalItems": False}
            }
        },
    },
    "oneOf of allOf branches on a discriminator": {
        "type": "object",
        "required": ["kind"],
        "oneOf": [
            {"allOf": [{"properties": {"kind": {"const": "cat"}}}, {"$ref": "#/$defs/cat"}]},
            {"allOf": [{"properties": {"kind": {"const": "dog"}}}, {"$ref": "#/$defs/dog"}]},
        ],
        "$defs": {
            "cat": {"properties": {"lives": {"type": "integer"}}},
            "dog": {"properties": {"lives": {"maximum": 1}}},
        },
    },
    "oneOf of overlapping patterns": {
        "type": "string",
        "oneOf": [{"pattern": "^a"}, {"pattern": "b$"}],
    },
    "oneOf of patterns no string matches both": {
        "type": "string",
        "oneOf": [{"pattern": "^a+$"}, {"pattern": "^b"}],
    },
    "patternProperties that overlap": {
        "type": "object",
        "patternProperties": {"a": {"type": "integer"}, "b": {"minimum": 2}},
        "additionalProperties": {"type": "string"},
    },
    "patterns and a not as one pattern": {
        "type": "string",
        "anyOf": [{"pattern": "^a"}, {"pattern": "c"}],
        "not": {"pattern": "^ab"},
    },
    "two patterns as one": {"type": "string", "allOf": [{"pattern": "^a"}, {"pattern": "b"}]},
    "a pattern beside a format is kept": {
        "type": "string",
        "format": "email",
        "allOf": [{"pattern": "^a"}, {"pattern": "b"}],
    },
    "oneOf of null and an object-only branch": {
        "oneOf": [{"type": "null"}, {"properties": {"a": {"type": "string"}}, "required": ["a"]}],
    },
    "oneOf of null and a $ref beside an annotation": {
        "$defs": {"c": {"type": "object", "properties": {"a": {"type": "integer"}}}},
        "oneOf": [{"type": "null"}, {"$ref": "#/$defs/c", "description": "a c"}],
    },
    "patternProperties of allOf branches that overlap": {
        "type": "object",
        "allOf": [
            {"patternProperties": {"a": {"type": "number", "minimum": 10}}},
            {"patternProperties": {"b": {"type": "number", "minimum": 3}}},
        ],
        "minProperties": 1,
    },
    "oneOf of closed objects, the keys one requires in its own oneOf": {
        "oneOf": [
            {
                "type": "object",
                "properties": {"f": {}, "v": {}, "r": {}},
                "additionalProperties": False,
                "oneOf": [{"required": ["f", "v"]}, {"required": ["f", "r"]}],
            },
            {
                "type": "object",
                "properties": {"f": {}},
                "required": ["f"],
                "additionalProperties": False,
            },
        ],
    },
    "a dependency on a discriminator its oneOf reads": {
        "type": "object",
        "properties": {"kind": {"type": "string"}},
        "dependentSchemas": {
            "kind": {
                "oneOf": [
                    {"properties": {"kind": {"const": "cat"}, "lives": {"type": "integer"}}},
                    {"properties": {"kind": {"const": "dog"}, "lives": {"maximum": 1}}},
                ]
            }
        },
    },
    "propertyNames of a pattern": {
        "type": "object",
        "propertyNames": {"pattern": "^a"},
        "properties": {"b": {}, "ab": {"type": "string"}},
        "additionalProperties": {"type": "integer"},
    },
    "propertyNames of listed names or a length": {
        "propertyNames": {"anyOf": [{"enum": ["kind", "lives", 3]}, {"maxLength": 1}]},
        "patternProperties": {"^k": {"type": "string"}, "s$": {"minimum": 2}},
    },
    "propertyNames beside unevaluatedProperties is kept": {
        "propertyNames": {"maxLength": 2},
        "unevaluatedProperties": {"type": "integer"},
    },
    "a recursive reference beside other keywords": {
        "$defs": {"node": _recursive_node("a", {"$ref": "#/$defs/node", "required": ["b"]})},
        "$ref": "#/$defs/node",
    },
    "a recursive reference in an allOf": {
        "$defs": {
            "node": _recursive_node("a", {"allOf": [{"$ref": "#/$defs/node"}, {"required": ["b"]}]})
        },
        "$ref": "#/$defs/node",
    },
    "a recursive reference in an anyOf beside other keywords": {
        "$defs": {
            "node": _recursive_node(
                "a", {"minProperties": 1, "anyOf": [{"$ref": "#/$defs/node"}, {"required": ["c"]}]}
            )
        },
        "$ref": "#/$defs/node",
    },
    "a listed property with the schema of a pattern it matches": {
        "type": "object",
        "properties": {
            "by": {"type": "array", "items": {"type": "integer"}, "title": "By"},
            "c": {"type": "string"},
            "D": {"type": "array", "items": {"type": "integer"}},
        },
        "patternProperties": {"^[a-z]+": {"type": "array", "items": {"type": "integer"}}},
    },
    "a draft-4 list beside integer": {
        "$schema": DRAFT4,
        "type": "integer",
        "enum": [1.5, 2, 3],
        "maximum": 2,
    },
}
"""One schema per rewrite (and per shape a rewrite must leave alone)."""

_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 5),
    st.sampled_from([1.0, 2.5, -0.5]),
    st.sampled_from(["a", "ab", "abc", "b", "c", "", "x", "a\n", "2024-02-29", "12:00:00Z", "x\n"]),
)
ANY_JSON = st.recursive(
    _SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.sampled_from(["a", "b", "c", "kind", "lives", "x"]), inner, max_size=4)
    ),
    max_leaves=12,
)
"""Instances near the cases' keywords: their property names, small numbers, dates."""


def _ends_in_a_newline(instance: Any) -> bool:
    if isinstance(instance, str):
        return instance.endswith("\n")
    if isinstance(instance, dict):
        return any(_ends_in_a_newline(k) or _ends_in_a_newline(v) for k, v in instance.items())
    return isinstance(instance, list) and any(map(_ends_in_a_newline, instance))


def _agree(schema: Any, instance: Any) -> None:
    """jsonschema's verdict is the same on both forms; where lowering wrote a pattern for a
    backend's `$`, only on instances without a string ending in a newline (the backends'
    reading of those is tested by the backend tests)."""
    lowered = lower_schema(schema)
    if _ends_in_a_newline(instance) and any(
        "for a backend's `$`" in r.detail for r in lowered.rewrites
    ):
        return
    verdict = validates(lowered.schema, instance, strict_integers=lowered.strict_integers)
    assert validates(schema, instance) == verdict, (
        f"lowering changed the verdict on {instance!r}: {json.dumps(lowered.schema)}"
    )


def _recursive(schema: Any) -> bool:
    """Whether a `$ref` of `schema` sits inside its own target (how the cases recurse)."""
    refs, _ = references(schema, None)
    return any(pointer.startswith(ref[1:] + "/") for ref, pointer in refs)


def _instances(schema: Any) -> st.SearchStrategy[Any]:
    """Instances of the schema and of its lowered form, and arbitrary nearby JSON."""
    strategies = [ANY_JSON]
    for source in (schema, lower_schema(schema).schema):
        if _recursive(source):  # hypothesis-jsonschema cannot generate from these
            continue
        try:  # a copy: hypothesis-jsonschema resolves references in place
            strategies.append(from_schema(copy.deepcopy(source)))
        except Exception:  # a shape hypothesis-jsonschema cannot generate from
            continue
    return st.one_of(strategies)


@pytest.mark.parametrize("name", sorted(CASES))
@settings(suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_each_rewrite_keeps_every_verdict(name: str, data: st.DataObject) -> None:
    schema = CASES[name]
    _agree(schema, data.draw(_instances(schema)))


PROBES: list[Any] = [
    None, True, False, 0, 1, 1.0, 1.5, 2, 2.5, 3, 3.0, 4, -1, "", "a", "ab", "abc", "b", "x",
    "a\n", "2024-02-29", "2023-02-29", "12:00:00Z", "2024-02-29T12:00:00Z", [], [1], [1, "a"],
    [1, "a", True], [1, "a", 2], {}, {"a": 1}, {"b": "x"}, {"a": 1, "b": "x"},
    {"a": 1, "b": "x", "c": 1}, {"c": 1}, {"kind": "cat"}, {"kind": "dog"}, {"x": 5},
    {"kind": 1}, {"kind": "cat", "lives": 9}, {"c": 1, "a": 2}, {"c": 1, "b": 2}, {"c": 1, "d": 2},
    ["a", "b"], [1, 2], 3.5, 1.9999, -0.5, ["a"], [1, "a"], {"kind": "cat", "lives": 1, "x": 1},
    {"status": "ok"}, {"status": "ok\n"}, {"status": "fail"}, {"status": "no"}, {"op": "or"},
    {"op": "or", "v": 1}, {"op": "eq"}, {"op": "eq", "v": 1}, {"v": 1}, {"a": "x", "b": 1},
    {"a": "x"}, {"a": "x", "b": "y"}, {"b": "y"}, {"a": 1, "b": "y"}, "abcd", 0.5, 2.0000001,
    -3, {"a": 1, "c": 2}, [1, 2], [1], ["a"], "abc\n", "b\n", "ab\n", {"kind": "dog", "lives": 1},
    {"kind": "dog", "lives": 2}, {"kind": "cat", "lives": 1.5}, {"kind": "fox"}, {"lives": 1},
]  # fmt: skip
"""Values at the cases' edges (bounds, equal numbers, listed strings, present properties)."""


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_rewrite_keeps_the_verdict_on_every_probe(name: str) -> None:
    for instance in PROBES:
        _agree(CASES[name], instance)


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_case_is_a_valid_schema_both_ways(name: str) -> None:
    """The lowered schema is valid 2020-12 (or the user's draft, when not converted)."""
    lowered = lower_schema(CASES[name]).schema
    cls = jsonschema.validators.validator_for(lowered, default=jsonschema.Draft202012Validator)
    cls.check_schema(lowered)


def test_the_rewrites_ran_where_they_should_and_not_elsewhere() -> None:
    rules = {
        name: {r.rule for r in lower_schema(schema).rewrites} for name, schema in CASES.items()
    }
    assert rules["integer-valued counts"] == {"count"}
    assert rules["date"] == rules["time"] == rules["date-time"] == {"format"}
    assert set(lower_schema(CASES["date"]).schema) == {"type", "pattern", "maxLength"}
    assert "format" not in lower_schema(CASES["a format no draft defines"]).schema
    for kept in (
        "not integer is kept",
        "oneOf integer and number is kept",
        "oneOf whose not has no positive form is kept",
    ):
        assert rules[kept] == set(), kept
    assert "oneOf" in lower_schema(CASES["draft-4 oneOf on consts is kept"]).schema
    matched = lower_schema(CASES["a listed property with the schema of a pattern it matches"])
    assert [r.pointer for r in matched.rewrites if r.rule == "patternProperties"] == [
        "/properties/by"
    ]
    assert matched.schema["properties"]["by"] == {}
    for recursive in (
        "a recursive reference beside other keywords",
        "a recursive reference in an allOf",
        "a recursive reference in an anyOf beside other keywords",
    ):
        assert rules[recursive] == {"$ref"}, recursive
    for converted in (
        "oneOf of touching bounds",
        "oneOf of arrays whose items come from lists apart",
        "oneOf of arrays that may be empty",
        "oneOf of open objects where each branch settles the shared property",
        "oneOf of closed objects that share a property with no positive not",
        "oneOf of types",
        "oneOf of consts",
        "oneOf on a discriminator",
        "oneOf on a discriminator the siblings require",
        "oneOf where a required key is one the other closes out",
        "oneOf of string lengths",
        "oneOf of number intervals",
        "oneOf of array counts",
        "oneOf of a schema and its not",
        "oneOf of anyOf branches of other kinds",
        "oneOf of object-only branches on a discriminator",
        "oneOf where the other branch requires the discriminator",
        "oneOf of literal patterns",
        "oneOf of arrays by their first item",
        "oneOf without the object type, on a required discriminator",
        "oneOf of open objects, each without the others",
        "oneOf of overlapping types",
        "oneOf with a branch that accepts everything",
        "oneOf of overlapping ranges",
        "oneOf of a pattern and values it refuses",
        "oneOf beside a branch of unknown keywords",
        "oneOf of closed objects sharing the empty object",
        "oneOf of closed objects sharing a property",
        "oneOf of overlapping patterns",
        "oneOf of patterns no string matches both",
        "oneOf of a pattern and every string",
        "oneOf of a pattern and a value it takes",
        "oneOf of null and an object-only branch",
        "oneOf of null and a $ref beside an annotation",
        "oneOf of closed objects, the keys one requires in its own oneOf",
        "a dependency on a discriminator its oneOf reads",
        "oneOf whose branches require keys a shared not forbids together",
        "oneOf of arrays whose branches carry an id annotation",
    ):
        assert "oneOf" not in json.dumps(lower_schema(CASES[converted]).schema), converted
    assert lower_schema(CASES["draft-7 tuple"]).schema["$schema"].endswith("2020-12/schema")
    assert "prefixItems" in lower_schema(CASES["draft-4 subschema ids without a $ref"]).schema
    strict = lower_schema(CASES["draft-4 integer, read strictly"])
    assert strict.strict_integers and any("draft-4 meaning" in r.detail for r in strict.rewrites)
    in_place = lower_schema(CASES["a $ref into a rewritten oneOf keeps it in place"])
    assert "oneOf" in in_place.schema and {r.rule for r in in_place.rewrites} == {"format"}
    assert "not" in lower_schema(CASES["not not through $ref is kept"]).schema
    assert "not" not in lower_schema(CASES["not through $ref"]).schema
    for name in ("not of a deep nesting", "not of string lengths", "not of number bounds",
                 "not of counts", "not of a zero count"):  # fmt: skip
        assert "not" not in json.dumps(lower_schema(CASES[name]).schema), name
    assert "oneOf" not in lower_schema(CASES["oneOf of required sets"]).schema
    assert "not" not in lower_schema(CASES["not enum"]).schema
    assert "not" in lower_schema(CASES["not const with a newline is kept"]).schema
    assert "if" not in lower_schema(CASES["if/then/else on a discriminator"]).schema
    assert "if" in lower_schema(CASES["if that has no positive not is kept"]).schema
    assert "if" not in lower_schema(CASES["if whose then is empty and else absent"]).schema
    assert lower_schema(CASES["a decimal step of two fraction digits"]).schema["allOf"] == [
        {"anyOf": [{"multipleOf": 0.5}, {"multipleOf": 0.25}]}
    ]
    assert rules["a decimal step of three fraction digits beside integers"] == set()
    assert lower_schema(CASES["a decimal step of three fraction digits"]).schema["allOf"] == [
        {"anyOf": [{"multipleOf": 1.5}, {"multipleOf": 0.75}, {"multipleOf": 0.375}]}
    ]
    assert lower_schema(CASES["if whose then and else are the same"]).schema == {
        "allOf": [{"minimum": 2}]
    }
    assert rules["anchor references"] == rules["draft-4 id anchor references"] - {"draft"}
    assert rules["anchor references"] == {"$ref"}
    assert lower_schema(CASES["anchor references"]).schema["properties"]["a"] == {
        "$ref": "#/$defs/n"
    }
    assert rules["an anchor beside an embedded resource is kept"] == set()
    listed = {
        name: lower_schema(CASES[name]).schema
        for name in ("a list beside a not", "a list beside a pattern", "a list that nothing passes",
                     "a list of objects beside a oneOf")
    }  # fmt: skip
    assert listed["a list beside a not"] == {"enum": [1, 3]}  # "a" passes multipleOf
    assert listed["a list beside a pattern"] == {"title": "t", "enum": ["ab", 3]}
    assert listed["a list that nothing passes"] is False
    assert listed["a list of objects beside a oneOf"] == {"enum": [{"a": 1}, {"b": "x"}]}
    assert (
        "oneOf"
        in lower_schema(CASES["oneOf whose branches require keys a not forbids only one of"]).schema
    )
    for name in ("minProperties 1 beside optional properties",
                 "minProperties that the required properties meet"):  # fmt: skip
        assert "minProperties" not in lower_schema(CASES[name]).schema, name
    assert rules["minProperties the required properties do not meet is kept"] == set()
    for name in ("not of propertyNames false", "not of propertyNames that refuse a name",
                 "not of propertyNames that refuse names"):  # fmt: skip
        assert '"not"' not in json.dumps(lower_schema(CASES[name]).schema), name
    beside = lower_schema(CASES["date-time beside a pattern"]).schema
    assert "format" not in beside and beside["pattern"] != "Z$"  # both, as one pattern
    for name in ("listed integral decimals", "a const integral decimal in an object"):
        text = json.dumps(lower_schema(CASES[name]).schema)
        assert rules[name] == {"enum"} and ".0," not in text and '"multipleOf": 0.5' in text
    for kept in ("a plain list is left", "a list beside a $ref below the root is kept"):
        assert "enum" not in rules[kept], kept
    assert lower_schema(CASES["a list beside a $ref at the root"]).schema == {"enum": [2]}
    assert lower_schema(CASES["a list beside a $ref into a not not at the root"]).schema == {
        "enum": [{"a": {}}]
    }
    assert lower_schema(CASES["a draft-4 list beside integer"]).schema["enum"] == [2]
    unique = lower_schema(CASES["uniqueItems of listed items"]).schema["enum"]
    assert len(unique) == 3 + 6 + 6 and [2, "a", 1] in unique and [] not in unique
    assert len(lower_schema(CASES["uniqueItems of booleans"]).schema["enum"]) == 5
    for kept in ("uniqueItems of equal listed items is kept", "uniqueItems of open items is kept"):
        assert "uniqueItems" in lower_schema(CASES[kept]).schema, kept
    for name in ("not of a pattern", "not of an unanchored pattern, any type"):
        assert "not" not in json.dumps(lower_schema(CASES[name]).schema), name
    assert "not" in lower_schema(CASES["not of a lookahead is kept"]).schema
    for name in ("not of a leading lookahead", "a leading negative lookahead",
                 "leading lookaheads on any type", "a pattern with an end anchor inside",
                 "a pattern with a start anchor inside, any type"):  # fmt: skip
        text = json.dumps(lower_schema(CASES[name]).schema)
        assert "(?" not in text and '"not"' not in text and "pattern" in rules[name], name
    written = lower_schema(CASES["a pattern with an end anchor inside"]).schema["pattern"]
    assert written.count("$") == 1 and written.endswith("$")
    nothing = lower_schema({"type": "string", "pattern": "x^y"}).schema  # `^` only at 0
    assert nothing["pattern"] == "[^\\s\\S]"
    assert rules["a pattern with a word boundary is kept"] == set()  # Python's \w written out
    for name in ("a name pattern with a leading lookahead", "a name pattern with an anchor inside"):
        names = lower_schema(CASES[name]).schema["patternProperties"]
        assert rules[name] == {"patternProperties"} and "(?" not in json.dumps(names), name
        assert all(n.count("$") == 1 and n.endswith("$") for n in names), name
    behind = lower_schema(CASES["a draft-7 tuple behind a $ref to a key no keyword names"]).schema
    assert behind["definitions"]["g"]["full"] == {
        "type": "array", "prefixItems": [{"type": "integer"}], "items": False
    }  # fmt: skip
    assert "oneOf" not in lower_schema(CASES["oneOf of allOf branches on a discriminator"]).schema
    assert rules["patternProperties that overlap"] == {"patternProperties"}
    assert (
        len(lower_schema(CASES["patternProperties that overlap"]).schema["patternProperties"]) == 3
    )
    apart = lower_schema(CASES["oneOf of patterns no string matches both"]).rewrites
    assert apart[0].detail == "oneOf with disjoint branches -> anyOf"
    for name in ("patterns and a not as one pattern", "two patterns as one"):
        assert set(lower_schema(CASES[name]).schema) == {"type", "pattern"}, name
    assert "pattern" not in rules["a pattern beside a format is kept"]
    aligned = lower_schema(CASES["patternProperties of allOf branches that overlap"]).schema
    keys = [set(branch["patternProperties"]) for branch in aligned["allOf"]]
    assert len(keys[0] & keys[1]) == 1 and len(keys[0] | keys[1]) == 3  # a and b, a, b
    for name in ("propertyNames of a pattern", "propertyNames of listed names or a length"):
        names = lower_schema(CASES[name]).schema
        assert "propertyNames" not in names and names["additionalProperties"] is False, name
    assert set(lower_schema(CASES["propertyNames of a pattern"]).schema["properties"]) == {"ab"}
    assert rules["propertyNames beside unevaluatedProperties is kept"] == set()
    listed_one = {"$schema": DRAFT4, "type": "integer", "enum": [1.0, 2], "maximum": 2}
    assert "type" in lower_schema(listed_one).schema  # 1 passes, 1.0 does not: both equal 1.0


NAMES_ENDING_IN_DOLLAR = {
    "type": "object",
    "patternProperties": {"^a$": {"type": "integer"}, "b$|^c": {"minimum": 2}},
    "additionalProperties": {"type": "string"},
}
"""Name patterns ending in `$`: Python's (jsonschema's) also matches before a final newline."""


NAMES_INSIDE_A_CLASS = {
    "type": "object",
    "patternProperties": {
        "^[a-z0-9-]+$": {"type": "string"},
        **{f"^{name}$": {"maxLength": 3} for name in ("md5", "sha-1", "sha-256", "crc", "xx")},
    },
    "additionalProperties": False,
}
"""Five literal names inside a class: six regions (each name, the class without them)."""


def test_name_patterns_ending_in_dollar_take_the_final_newline() -> None:
    """Rewritten so that a backend, whose `$` is only the end, matches the names jsonschema
    matches; jsonschema reads the rewritten pattern with one more final newline, so the
    verdicts agree on every name without two final newlines."""
    lowered = lower_schema(NAMES_ENDING_IN_DOLLAR)
    assert {r.rule for r in lowered.rewrites} == {"patternProperties"}
    assert "^a\\n?$" in lowered.schema["patternProperties"]
    for name in ("a", "a\n", "ab", "b", "b\n", "ab\n", "c", "c\n", "x", "x\n", "\n"):
        for value in (1, 3, "x"):
            _agree(NAMES_ENDING_IN_DOLLAR, {name: value})
    assert lower_schema(lowered.schema).schema != lowered.schema  # read as jsonschema does
    split = lower_schema(NAMES_INSIDE_A_CLASS).schema["patternProperties"]
    assert len(split) == 6 and {"allOf"} == set(split["^md5\\u000a?$"])
    for name in ("md5", "md5\n", "sha-1", "crc", "abc", "ab\n", "A", "xx", "x"):
        for value in ("ab", "abcd", 1):
            _agree(NAMES_INSIDE_A_CLASS, {name: value})


STRINGS_FOR_A_BACKEND = {
    "type": "string",
    "maxLength": 3,
    "allOf": [{"pattern": "^a"}, {"pattern": "c$"}],
}
"""A length bound beside a `$`: "ac" passes with a final newline ("ac\\n", 3 characters), "abc"
does not (4), so no pattern reads the same under Python's `$` and a backend's."""


@settings(max_examples=200)
@given(text=st.text(alphabet=st.sampled_from("abc\n"), max_size=5))
def test_one_pattern_is_written_for_a_backend_where_no_pattern_reads_alike(text: str) -> None:
    """The pattern, matched whole as a backend's `$` reads it, takes exactly the strings
    jsonschema takes against the user's schema; jsonschema reading the lowered schema
    agrees on every string without a final newline."""
    lowered = lower_schema(STRINGS_FOR_A_BACKEND)
    assert [
        r.detail.endswith("(jsonschema's takes a final newline)") for r in lowered.rewrites
    ] == [True]
    pattern = lowered.schema["pattern"]
    as_a_backend = re.fullmatch(pattern[1:-1], text) is not None
    assert as_a_backend == validates(STRINGS_FOR_A_BACKEND, text), (pattern, text)
    if not text.endswith("\n"):
        _agree(STRINGS_FOR_A_BACKEND, text)


def test_a_lowered_schema_is_left_unchanged_by_lowering_again() -> None:
    """Lowering is one pass, and complete where no `$ref` is involved (through one, a
    second pass may read a lowered target that the first read unlowered) and no name
    pattern was written for a backend's `$` (a second pass reads it as jsonschema does)."""
    for name, schema in CASES.items():
        if "$ref" in json.dumps(schema):
            continue
        first = lower_schema(schema)
        if any("final newline" in r.detail for r in first.rewrites):
            continue
        once = first.schema
        assert lower_schema(once).schema == once, name


_DATE_LIKE = st.builds(
    "{}-{}-{}".format,
    st.sampled_from(["0000", "0001", "1900", "2000", "2023", "2024", "2100", "2400", "9999"]),
    st.sampled_from(["00", "01", "02", "04", "09", "10", "12", "13"]),
    st.sampled_from(["00", "01", "28", "29", "30", "31", "32"]),
)
_TIME_LIKE = st.builds(
    "{}:{}:{}{}{}".format,
    st.sampled_from(["00", "09", "23", "24"]),
    st.sampled_from(["00", "59", "60"]),
    st.sampled_from(["00", "59", "60"]),
    st.sampled_from(["", ".5", ".123456", ",5", "."]),
    st.sampled_from(["Z", "z", "+00:00", "-23:59", "+24:00", "+05:60", "", "+0500"]),
)
_NOISE = st.sampled_from(["", "\n", " ", "x", "\n\n"])


@given(
    day=_DATE_LIKE,
    at=_TIME_LIKE,
    separator=st.sampled_from(["T", "t", " ", "_"]),
    before=_NOISE,
    after=_NOISE,
)
def test_date_and_time_patterns_are_the_format_checkers(
    day: str, at: str, separator: str, before: str, after: str
) -> None:
    """Leap years, month lengths, year 0, offsets, fractions, case and a final newline
    (which Python's `$` lets through for the date-time formats, not for `date`)."""
    for name, text in (
        ("date", before + day + after),
        ("date-time", before + day + separator + at + after),
        ("time", before + at + after),
    ):
        _agree({"type": "string", "format": name}, text)


def test_the_date_pattern_knows_every_day_of_the_leap_rule_years() -> None:
    lowered = lower_schema({"format": "date"}).schema
    checker = jsonschema.Draft202012Validator(lowered)
    for year in (1, 4, 100, 400, 1900, 1999, 2000, 2024, 2100, 9999):
        for month in range(1, 13):
            for day in range(1, 33):
                text = f"{year:04d}-{month:02d}-{day:02d}"
                try:
                    date(year, month, day)
                    real = True
                except ValueError:
                    real = False
                assert checker.is_valid(text) == real, text


@pytest.mark.parametrize("backend", ["llguidance", "xgrammar"])
def test_backends_enforce_the_date_pattern_fully(
    deepseek: gm.Vocabulary, deepseek_compiler: gm.GrammarCompiler, backend: str
) -> None:
    """With the exact pattern, both backends serve the date formats fully (auto no longer
    refuses them), and the masks accept February 29 only in leap years."""
    if backend not in gm.installed_backends():
        pytest.fail(f"{backend} is not installed: pip install 'grammarmask[dev]'")
    grammar = gm.Grammar.json_schema({"type": "string", "format": "date"})
    compiler = deepseek_compiler
    compiled = compiler.compile(grammar, backend)
    assert compiled.unenforced == ()
    assert compiler.compile(
        gm.Grammar.json_schema({"type": "string", "format": "date-time"}), "auto"
    ).fully_enforced
    table = byte_token_ids(deepseek)
    matcher = compiled.matcher()
    for text, valid in [
        ('"2024-02-29"', True),
        ('"2023-02-29"', False),
        ('"2000-02-29"', True),
        ('"1900-02-29"', False),
        ('"2023-04-31"', False),
        ('"0000-01-01"', False),
    ]:
        assert feed(matcher, [table[b] for b in text.encode()])[0] == valid, text


_URI_PIECES = (
    "http", "a", "1a", "A+b", "v1", ":", "//", "/", "?", "#", "@", ".", "-", "~", "'", "%2F",
    "%z", "[", "]", "::", "::1", "1", "ffff", "1:2", "1.2.3.4", "256", ":8080", " ", "é", "\n",
    "::ffff:1.2.3.4", "1:2:3:4:5:6:7", "1:2:3:4:5:6:7:8",
)  # fmt: skip
"""Pieces of URIs and of near misses: schemes, authorities, IPv6 and IPv4 groups, percent
escapes good and bad, characters a URI never holds, a final newline."""


@settings(max_examples=400)
@given(
    pieces=st.lists(st.sampled_from(_URI_PIECES), max_size=9),
    in_brackets=st.booleans(),
)
def test_the_uri_reference_pattern_is_the_format_checker(
    pieces: list[str], in_brackets: bool
) -> None:
    """RFC 3986 as `rfc3986_validator` (jsonschema's checker) reads it: relative references
    with no colon in their first segment, IP literals, escapes, a final newline."""
    text = "".join(pieces)
    _agree({"type": "string", "format": "uri-reference"}, f"//[{text}]" if in_brackets else text)


@pytest.mark.parametrize("backend", ["llguidance", "xgrammar", "outlines"])
def test_backends_enforce_the_uri_reference_pattern_fully(
    deepseek: gm.Vocabulary, deepseek_compiler: gm.GrammarCompiler, backend: str
) -> None:
    """Every backend serves `uri-reference` fully with its pattern (none checks the format
    itself), and the mask refuses a colon in a relative reference's first segment."""
    schema = {"type": "string", "format": "uri-reference"}
    compiled = deepseek_compiler.compile(gm.Grammar.json_schema(schema), backend)
    assert compiled.unenforced == ()
    table = byte_token_ids(deepseek)
    for text in ('"http://u@h:8/p?q#f"', '"../a/b"', '"//[::1]/"', '":a"', '"1a:b"', '"a b"'):
        accepted = feed(compiled.matcher(), [table[b] for b in text.encode()])[0]
        assert accepted == validates(schema, json.loads(text)), text


def _sample_files() -> list[Any]:
    return sorted(bundled_sample_dir().glob("*.json")) + sorted(SCHEMAS.glob("*.json"))


@pytest.mark.parametrize("path", _sample_files(), ids=lambda p: p.stem)
def test_bundled_schemas_keep_every_verdict(path: Any) -> None:
    document = json.loads(path.read_text(encoding="utf-8"))
    schema = document.get("schema", document)
    instances = [t["data"] for t in document.get("tests", [])]
    instances += document.get("examples", []) if isinstance(document, dict) else []
    for instance in instances:
        _agree(schema, instance)


@pytest.mark.corpus
def test_every_corpus_instance_keeps_its_verdict(corpus_dir: Path) -> None:
    """Every instance of every MaskBench schema: a rewrite that changes one is a bug."""
    changed, judged = [], 0
    for path in sorted(corpus_dir.glob("*.json")):
        document = json.loads(path.read_text(encoding="utf-8"))
        schema = document.get("schema", document)
        try:
            gm.Grammar.json_schema(schema)
        except gm.GrammarError:
            continue
        lowered = lower_schema(schema)
        strict = lowered.strict_integers
        for test in document.get("tests", []):
            try:
                before = validates(schema, test["data"])
            except SchemaJudgeError:
                continue  # nothing to keep
            after = validates(lowered.schema, test["data"], strict_integers=strict)
            judged += 1
            if before != after:
                changed.append(f"{path.stem}: {json.dumps(test['data'])[:80]}")
    assert judged > 1000, f"only {judged} corpus instances judged in {corpus_dir}"
    assert changed == []


@pytest.mark.parametrize("backend", ["llguidance", "xgrammar"])
def test_backends_enforce_lowered_combinators(
    deepseek: gm.Vocabulary, deepseek_compiler: gm.GrammarCompiler, backend: str
) -> None:
    """`not` an enum (a string pattern from a trie), `not` a pattern (its complement) and a
    count with a decimal point, as the backends compile them: the listed strings, the
    matching ones and the longer arrays are refused."""
    table = byte_token_ids(deepseek)
    schemas = {
        "not enum": (
            {"type": "string", "not": {"enum": ["ab", "a"]}},
            [('"abc"', True), ('"b"', True), ('""', True), ('"ab"', False), ('"a"', False)],
        ),
        "uniqueItems of listed items": (
            {"type": "array", "items": {"enum": ["a", "b"]}, "uniqueItems": True},
            [('["a","b"]', True), ('["b"]', True), ('["a","a"]', False), ('["b","a","b"]', False)],
        ),
        "not pattern": (
            {"type": "string", "not": {"pattern": "^a|c$"}},
            [('"ba"', True), ('""', True), ('"a"', False), ('"abc"', False), ('"bc"', False)],
        ),
        "name patterns ending in $": (
            NAMES_ENDING_IN_DOLLAR,
            [
                ('{"a\\n":"x"}', False),
                ('{"a\\n":1}', True),
                ('{"b\\n":1}', False),
                ('{"b\\n":2}', True),
                ('{"x\\n":1}', False),
                ('{"x":"y"}', True),
            ],
        ),
        "patternProperties that overlap": (
            CASES["patternProperties that overlap"],
            [
                ('{"ab":1}', False),
                ('{"ab":2}', True),
                ('{"a":1}', True),
                ('{"b":1}', False),
                ('{"b":"x"}', True),
                ('{"ab":"x"}', False),
                ('{"c":"x"}', True),
            ],
        ),
        "patterns and lengths for a backend's $": (
            STRINGS_FOR_A_BACKEND,
            [
                ('"ac"', True),
                ('"abc"', True),
                ('"ac\\n"', True),
                ('"abc\\n"', False),
                ('"ab"', False),
                ('"bc"', False),
                ('"a\\nc"', True),
            ],
        ),
        "patternProperties of allOf branches": (
            CASES["patternProperties of allOf branches that overlap"],
            [
                ('{"ab":10}', True),
                ('{"ab":5}', False),
                ('{"a":10}', True),
                ('{"a":5}', False),
                ('{"b":3}', True),
                ('{"b":2}', False),
                ('{"c":1}', True),
                ("{}", False),
            ],
        ),
        "propertyNames of a pattern": (
            CASES["propertyNames of a pattern"],
            [
                ('{"a":1}', True),
                ('{"ab":"x"}', True),
                ('{"ab":1}', False),
                ('{"b":1}', False),
                ('{"x":1}', False),
                ('{"ac":"s"}', False),
                ('{"ac":2}', True),
                ('{"a\\n":1}', True),
            ],
        ),
        "propertyNames of listed names or a length": (
            CASES["propertyNames of listed names or a length"],
            [
                ('{"kind":"cat"}', True),
                ('{"kind":1}', False),
                ('{"lives":3}', True),
                ('{"lives":1}', False),
                ('{"x":null}', True),
                ('{"xy":1}', False),
                ('{"kind\\n":"a"}', False),
            ],
        ),
        "oneOf of null and an object-only branch": (
            CASES["oneOf of null and an object-only branch"],
            [
                ("null", False),
                ('{"a":"x"}', True),
                ('{"a":1}', False),
                ("{}", False),
                ('"s"', True),
                ("1", True),
            ],
        ),
        "maxItems 2.0": (
            {"type": "array", "items": {"type": "integer"}, "maxItems": 2.0},
            [("[1,2]", True), ("[1,2,3]", False)],
        ),
        "minProperties 1 beside optional properties": (
            CASES["minProperties 1 beside optional properties"],
            [
                ("{}", False),
                ('{"a":"x"}', True),
                ('{"b":2}', True),
                ('{"c":true}', True),
                ('{"a":1}', False),
                ('{"a":"x","b":2}', True),
            ],
        ),
    }
    for name, (schema, probes) in schemas.items():
        if "patternProperties" in json.dumps(schema) and backend == "xgrammar":
            continue  # declared there, and it refuses valid names (a completeness gap)
        try:
            compiled = deepseek_compiler.compile(gm.Grammar.json_schema(schema), backend)
        except gm.UnsupportedGrammarError:
            # no anyOf of types there, nor a `false` property
            assert backend == "xgrammar" and name.startswith(("not", "minProperties"))
            continue
        matcher = compiled.matcher()
        for text, valid in probes:
            accepted = feed(matcher, [table[b] for b in text.encode()])[0]
            if backend == "xgrammar" and "\\n" in text:  # its escape gap (conformance.md)
                assert valid or not accepted or compiled.unenforced, (name, text)
            elif compiled.unenforced:  # declared loose: only the valid ones are owed
                assert accepted or not valid, (name, text)
            else:
                assert accepted == valid, (name, backend, text)


@pytest.mark.parametrize("backend", ["llguidance", "xgrammar", "outlines"])
def test_backends_write_integers_without_a_fraction(
    deepseek: gm.Vocabulary, deepseek_compiler: gm.GrammarCompiler, backend: str
) -> None:
    """What `strict_integers` rests on: each backend's "integer" refuses 1.0 and 1e0, so a
    lowered draft-4 schema keeps draft 4's meaning there (a draft-4 tuple as the example)."""
    table = byte_token_ids(deepseek)
    schema = {
        "$schema": DRAFT4,
        "type": "array",
        "items": [{"type": "integer"}],
        "additionalItems": False,
    }
    lowered = lower_schema(schema)
    assert lowered.strict_integers and "prefixItems" in lowered.schema
    compiled = deepseek_compiler.compile(gm.Grammar.json_schema(schema), backend)
    matcher = compiled.matcher()
    for text, valid in [("[1]", True), ("[-7]", True), ("[1.0]", False), ("[1e0]", False),
                        ("[1E0]", False), ("[1.5]", False), ("[1,2]", False)]:  # fmt: skip
        assert validates(schema, json.loads(text)) == valid, text
        accepted = feed(matcher, [table[b] for b in text.encode()])[0]
        # a declared looseness may accept an invalid text, never refuse a valid one
        assert accepted == valid or (compiled.unenforced and accepted), (backend, text)


@pytest.mark.parametrize("backend", ["llguidance", "xgrammar"])
def test_backends_take_both_spellings_of_a_listed_integral_decimal(
    deepseek: gm.Vocabulary, deepseek_compiler: gm.GrammarCompiler, backend: str
) -> None:
    """A listed 2.0 is written by the backends one way (2), yet 2.0 is the same value: the
    lowered list takes `2` and `2.0`, and no other number (outlines' numbers take no
    `2.0` at all)."""
    table = byte_token_ids(deepseek)
    cases = {
        json.dumps({"enum": [2.0, "x"]}): [
            ("2", True), ("2.0", True), ("-2", False), ("2.5", False), ("3", False),
            ("1.75", False), ('"x"', True), ('"2"', False),
        ],
        json.dumps({"const": {"a": 0.0}}): [
            ('{"a":0}', True), ('{"a":0.0}', True), ('{"a":0.5}', False),
            ('{"a":1}', False), ('{"a":0,"b":0}', False), ("{}", False),
        ],
    }  # fmt: skip
    for source, texts in cases.items():
        schema = json.loads(source)
        compiled = deepseek_compiler.compile(
            gm.Grammar.json_schema(schema), backend, allow_unenforced=True
        )
        matcher = compiled.matcher()
        for text, valid in texts:
            assert validates(schema, json.loads(text)) == valid, text
            accepted = feed(matcher, [table[b] for b in text.encode()])[0]
            assert accepted == valid or (compiled.unenforced and accepted), (backend, text)


INCLUDED = {
    "the same schema": ({"type": "string", "maxLength": 3}, {"type": "string", "maxLength": 3}),
    "a narrower pattern": ({"type": "string", "pattern": "^[a-f]+$"}, {"pattern": "^[a-f]*$"}),
    "tighter bounds": (
        {"type": "integer", "minimum": 3, "maximum": 5},
        {"minimum": 0, "maximum": 9},
    ),
    "items and properties": (
        {
            "type": "array",
            "items": {"type": "object", "required": ["a", "b"], "properties": {"a": {"const": 1}}},
        },
        {"type": "array", "items": {"required": ["a"], "properties": {"a": {"type": "integer"}}}},
    ),
}
NOT_INCLUDED = {
    "a wider pattern": ({"type": "string", "pattern": "^[a-f]*$"}, {"pattern": "^[a-f]+$"}, ""),
    "a type left out": ({"type": ["string", "null"]}, {"type": "string"}, None),
    "a looser bound": ({"type": "integer", "maximum": 10}, {"maximum": 9}, 10),
    "a property the outer one requires": ({"type": "object"}, {"required": ["a"]}, {}),
    "tuple items": (
        {"type": "array", "prefixItems": [{"type": "string"}], "items": {"type": "integer"}},
        {"items": {"type": "integer"}},
        ["a"],
    ),
}


@pytest.mark.parametrize("name", sorted(INCLUDED))
@settings(max_examples=40, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_included_holds_only_where_every_inner_value_is_an_outer_value(
    name: str, data: st.DataObject
) -> None:
    """`included` lets a `oneOf` rewrite skip the ways out of a branch that the kept branch
    rules out; an inclusion it claims falsely would drop instances."""
    inner, outer = INCLUDED[name]
    assert included(inner, outer, Reading(None, None))
    instance = data.draw(from_schema(inner))
    assert jsonschema.Draft202012Validator(outer).is_valid(instance)


@pytest.mark.parametrize("name", sorted(NOT_INCLUDED))
def test_included_is_refused_where_an_inner_value_fails_the_outer_schema(name: str) -> None:
    inner, outer, witness = NOT_INCLUDED[name]
    assert jsonschema.Draft202012Validator(inner).is_valid(witness)
    assert not jsonschema.Draft202012Validator(outer).is_valid(witness)
    assert not included(inner, outer, Reading(None, None))


@pytest.mark.parametrize("kind", sorted(FORMAT_SUPERSETS))
@settings(max_examples=150, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_each_format_superset_matches_every_string_the_checker_accepts(
    kind: str, data: st.DataObject
) -> None:
    """Two string branches are proved apart through their formats' supersets: a string the
    format checker accepts outside its superset would make a `oneOf` rewrite drop it."""
    text = data.draw(
        from_schema({"type": "string", "format": kind})
        | st.text(alphabet=st.sampled_from("aZ09.-:@%/_\n\u00e9 "), max_size=12)
    )
    if jsonschema.Draft202012Validator.FORMAT_CHECKER.conforms(text, kind):
        assert re.search(FORMAT_SUPERSETS[kind], text), text


def test_formats_prove_string_branches_apart() -> None:
    schema = {
        "type": "string",
        "oneOf": [{"format": "uri"}, {"format": "hostname"}, {"pattern": "^\\./"}],
    }
    assert "oneOf" not in lower_schema(schema).schema
    overlapping = {"type": "string", "oneOf": [{"format": "hostname"}, {"format": "ipv4"}]}
    assert "oneOf" in lower_schema(overlapping).schema  # "1.2.3.4" is both


@pytest.mark.parametrize(
    ("node", "branch"),
    [
        ({"if": {"const": 1}}, {"then": False}),
        ({"contains": {"const": 1}}, {"maxContains": 1}),
        ({"additionalProperties": False}, {"properties": {"a": {}}}),
        ({"prefixItems": [{"type": "string"}]}, {"items": False}),
        ({"unevaluatedProperties": False}, {"properties": {"a": {}}}),
    ],
)
def test_joined_refuses_keywords_that_read_each_other_split_apart(
    node: dict[str, Any], branch: dict[str, Any]
) -> None:
    """Side by side in one object these keywords mean something else than in an allOf of
    the two (`then` alone is ignored, `additionalProperties` covers its own object's
    `properties`): a join there would prove apart branches that overlap."""
    assert joined(node, branch) is None
    witness = {
        "if": 1,
        "contains": [1, 1],
        "additionalProperties": {"a": 0},
        "prefixItems": ["s"],
        "unevaluatedProperties": {"a": 0},
    }[next(iter(node))]
    validator = jsonschema.Draft202012Validator
    apart = validator({"allOf": [node, branch]}).is_valid(witness)
    assert apart != validator({**node, **branch}).is_valid(witness)


def test_joined_merges_keywords_that_stand_alone() -> None:
    node = {"type": "object", "required": ["a"], "properties": {"a": {"const": 1}}}
    assert joined(node, {"required": ["b"], "minProperties": 2}) == {
        **node,
        "required": ["a", "b"],
        "minProperties": 2,
    }
