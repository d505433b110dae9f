"""jsonschema's verdicts where the judge and lowering lean on them: a 2020-12 validator
with formats checked, the semantics lowering keeps and declarations are measured against."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def verdicts(
    schema: Any, instances: Sequence[Any], *, strict_integers: bool = False
) -> list[bool] | None:
    """Whether each instance validates against `schema` (read as 2020-12, formats checked;
    `strict_integers`: "integer" as draft 4 reads it, 1.0 none); None where jsonschema
    cannot judge `schema` alone (a `$ref` it cannot resolve, a malformed keyword)."""
    from jsonschema import Draft202012Validator  # imported on first use

    from .lowering.dialects import with_strict_integers

    cls: Any = (
        with_strict_integers(Draft202012Validator) if strict_integers else Draft202012Validator
    )
    try:
        validator = cls(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)
        return [validator.is_valid(instance) for instance in instances]
    except Exception:  # jsonschema raises several unrelated types here
        return None


def document_verdicts(document: Any, instances: Sequence[Any]) -> list[bool] | None:
    """Whether each instance validates against the whole `document`, read in the draft its
    `$schema` names (2020-12 when none; formats checked), its references resolved within
    it; None where jsonschema cannot judge it."""
    from jsonschema import Draft202012Validator
    from jsonschema.validators import validator_for

    try:
        cls: Any = validator_for(document, default=Draft202012Validator)
        validator = cls(document, format_checker=cls.FORMAT_CHECKER)
        return [validator.is_valid(instance) for instance in instances]
    except Exception:  # jsonschema raises several unrelated types here
        return None
