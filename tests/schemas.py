"""JSON schemas the structured-answer tests ask the real model for, each with a question
that leads to it: OpenAI's strict subset (nested objects, arrays with minItems, enums,
anyOf, number bounds, pattern and format, recursion through $ref)."""

from __future__ import annotations

from typing import Any

NAME = {"type": "string", "maxLength": 16}


def strict(properties: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """An object of OpenAI's strict subset: every property required, no others."""
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
        **extra,
    }


#: (what to ask, the schema the answer must hold).
SCHEMAS: list[tuple[str, dict[str, Any]]] = [
    (
        "Extract the order: 'Two blue mugs for Ana Ruiz, shipped to Lyon.'",
        strict(
            {
                "customer": strict({"first": NAME, "last": NAME}),
                "address": strict({"city": NAME, "country": NAME}),
                "quantity": {"type": "integer", "minimum": 1, "maximum": 9},
            }
        ),
    ),
    (
        "List three colours of the rainbow.",
        strict({"colours": {"type": "array", "items": NAME, "minItems": 3, "maxItems": 3}}),
    ),
    (
        "Classify: 'The blender broke after a day.'",
        strict(
            {
                "sentiment": {"enum": ["positive", "negative", "neutral"]},
                "stars": {"type": "integer", "minimum": 1, "maximum": 5},
                "refund": {"type": "boolean"},
            }
        ),
    ),
    (
        "Give a temperature in Celsius for a warm day, and a rating.",
        strict(
            {
                "celsius": {"type": "number", "minimum": 15, "maximum": 40},
                "rating": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
            }
        ),
    ),
    (
        "Give a product code and an order date.",
        strict(
            {
                "code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
                "date": {"type": "string", "format": "date"},
            }
        ),
    ),
    (
        "Name a pet: a dog with a name, or a fish with a tank size in litres.",
        strict(
            {
                "pet": {
                    "anyOf": [
                        strict({"kind": {"const": "dog"}, "name": NAME}),
                        strict({"kind": {"const": "fish"}, "litres": {"type": "integer"}}),
                    ]
                },
                "note": {"anyOf": [NAME, {"type": "null"}]},
            }
        ),
    ),
    (
        "Ana has two children, Ben and Eva. Ben and Eva have no children. Give Ana as a person.",
        {
            "$ref": "#/$defs/person",
            "$defs": {
                "person": strict(
                    {
                        "name": NAME,
                        "children": {
                            "type": "array",
                            "items": {"$ref": "#/$defs/person"},
                            "maxItems": 2,
                        },
                    }
                )
            },
        },
    ),
]
