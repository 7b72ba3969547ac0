"""Every field of the documented schemas (report.json, recipe YAML, target YAML) says what it holds (issue #38).

The docs build (docs/_gen/reference.py) renders one table per model, a field's description taken from
``Field(description=...)`` or, failing that, from the comment on the field's line or right above it. This walks the
same models the same way, so a field added without either fails here, naming it, instead of reaching the reference
pages as an empty cell."""

from __future__ import annotations

import pytest

# root model, and the fewest fields the walk must find (so that a walk that finds nothing cannot pass)
ROOTS = {
    "report": ("edgekit.report.model:Report", 300),
    "recipe": ("edgekit.inputs.recipe:Recipe", 30),
    "target": ("edgekit.inputs.targets:TargetSpec", 35),
}


def _reference():
    from docs._gen import reference  # the checkout's root is on pytest's pythonpath (pyproject.toml)

    return reference


def _fields_without_description(root_path: str) -> tuple[int, list[str]]:
    """(fields walked, ``Model.field`` of those with no description), as the docs build sees them."""
    ref = _reference()
    total, missing = 0, []
    for name, model in ref._models_by_name(ref._load(root_path)).items():
        comments = ref.source_comments(model)
        for key, field in ref._fields(model).items():
            total += 1
            if not (field.description or comments.get(key)):
                missing.append(f"{name}.{key}")
    return total, missing


@pytest.mark.parametrize("schema", sorted(ROOTS))
def test_every_schema_field_has_a_description(schema):
    root_path, at_least = ROOTS[schema]
    total, missing = _fields_without_description(root_path)
    assert total >= at_least, f"the {schema} schema walk found only {total} fields (expected >= {at_least})"
    assert not missing, (f"{len(missing)} of {total} {schema} schema fields have no description (a "
                         f"Field(description=...) or a comment on or right above the field): {', '.join(missing)}")
