"""The configuration reference (docs/configuration.md) is the model's own: generated from
its JSON schema, so a field added, renamed or re-described without regenerating it fails
here. Regenerate with `python -m exactly_once reference > docs/configuration.md`."""

from __future__ import annotations

from exactly_once.config import PipelineConfig, Sink, Source
from exactly_once.operate.reference import markdown
from exactly_once_stack.settings import ROOT


def test_the_committed_reference_is_the_models():
    assert (ROOT / "docs" / "configuration.md").read_text() == markdown()


def test_every_field_of_every_model_is_in_it_with_its_description():
    reference = markdown()
    for prefix, model in (("", PipelineConfig), ("source.", Source), ("sinks[].", Sink)):
        for name, field in model.model_fields.items():
            assert f"| `{prefix}{name}` |" in reference
            assert field.description and field.description in reference
    assert "| `sinks[].mode` | string | required | `aggregate`, `append`, `kafka`, `upsert` |" in reference
