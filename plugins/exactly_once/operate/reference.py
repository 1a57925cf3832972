"""The configuration reference, generated from the model's JSON schema (exactly_once.config):
every field with its type, default, valid values and description, in Markdown.
docs/configuration.md is its output (`python -m exactly_once reference`); a test fails when the
two drift."""

from __future__ import annotations

import json
from typing import Any

from exactly_once.config import PipelineConfig

HEADER = """\
# Pipeline configuration reference

Generated from `plugins/exactly_once/config.py` by `python -m exactly_once reference`
(a test fails when the two differ). A configuration is a mapping given
to `exactly_once.config.load_config`; an unknown field or an invalid value raises `ConfigError`
naming the field.
"""


def markdown() -> str:
    schema = PipelineConfig.model_json_schema()
    definitions = schema.get("$defs", {})
    sections = [("Pipeline", "", schema)]
    sections += [(f"`{prefix.rstrip('.')}`", prefix, definitions[name])
                 for prefix, name in (("source.", "Source"), ("sinks[].", "Sink"),
                                      ("source.*_reader_schema.", "RegistrySchema"),
                                      ("dead_letter_budget.", "DeadLetterBudget"),
                                      ("retention.", "Retention"))]
    parts = [HEADER]
    for title, prefix, model in sections:
        parts.append(f"\n## {title}\n\n| field | type | default | valid values | description |\n"
                     "|---|---|---|---|---|\n")
        required = set(model.get("required", ()))
        for field, spec in model["properties"].items():
            default = "required" if field in required else f"`{json.dumps(spec.get('default'))}`"
            cells = [f"`{prefix}{field}`", _type(spec), default, _valid(spec), spec.get("description", "")]
            parts.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |\n")
    return "".join(parts)


def _type(spec: dict[str, Any]) -> str:
    if "$ref" in spec:
        return "object (below)"
    if "anyOf" in spec:
        return " or ".join(_type(option) for option in spec["anyOf"])
    kind = spec.get("type")
    if kind == "array":
        return f"list of {_type(spec['items'])}"
    if kind == "object":
        [value] = spec.get("patternProperties", {"": {"type": "any"}}).values()
        return f"mapping of column → {_type(value)}"
    if kind == "string" and "format" in spec:
        return {"date-time": "timestamp (ISO 8601)", "duration": "duration (ISO 8601, e.g. PT1H)"}[spec["format"]]
    return str(kind)


def _valid(spec: dict[str, Any]) -> str:
    found = []
    for option in spec.get("anyOf", [spec]):
        if "enum" in option:
            found.append(", ".join(f"`{value}`" for value in option["enum"]))
        if "pattern" in option:
            found.append(f"matches `{option['pattern']}`")
        if "exclusiveMinimum" in option:
            found.append(f"> {option['exclusiveMinimum']}")
        if "maximum" in option:
            found.append(f"≤ {option['maximum']}")
        for bound in ("minItems", "minProperties"):
            if bound in option:
                found.append(f"at least {option[bound]}")
        if option.get("type") == "object" and "patternProperties" in option:
            [(column, value)] = option["patternProperties"].items()
            found.append(f"columns match `{column}`" + (f"; {_valid(value)}" if _valid(value) else ""))
        if option.get("type") == "array" and _valid(option["items"]):
            found.append(f"each {_valid(option['items'])}")
    return "; ".join(found)
