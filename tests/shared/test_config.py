"""Typed configuration: a bad value is refused with the field's name and the value."""

import pytest

from exactly_once.config import load_config, load_stored_config
from exactly_once.errors import ConfigError

VALID = {
    "name": "orders",
    "source": {"topics": ["orders"], "value_schema": {"sku": "string", "qty": "int"}},
    "sinks": [{"name": "totals", "table": "demo.totals", "mode": "aggregate", "keys": ["sku"],
               "measures": {"qty": "sum"}}],
}


def with_changes(**changes):
    config = {**VALID, **changes}
    return config


def test_a_valid_config_loads_with_defaults():
    config = load_config(VALID)
    assert config.on_bad_record == "dead_letter"
    assert config.allow_data_loss is False
    assert config.source.start == "earliest"
    assert config.sink("totals").schema_and_table == ("demo", "totals")


@pytest.mark.parametrize(("changes", "message"), [
    ({"name": "Orders!"}, "name: String should match pattern"),
    ({"sinks": [{"name": "x", "table": "demo.x", "mode": "merge"}]},
     "sinks.0.mode: unknown sink mode 'merge': the sink modes are aggregate, append, kafka, upsert (got 'merge')"),
    ({"sinks": [{"name": "x", "table": "demo.x", "mode": "upsert"}]}, "sinks.0: upsert sinks need keys"),
    ({"sinks": [{"name": "x", "table": "demo.x", "mode": "append", "keys": ["a"]}]}, "append sinks are keyed by"),
    ({"sinks": [{"name": "x", "table": "demo.x", "mode": "aggregate", "keys": ["a"]}]}, "aggregate sinks need measures"),
    ({"sinks": [{"name": "x", "table": "demo.x", "mode": "aggregate", "keys": ["a"], "measures": {"q": "avg"}}]},
     "sinks.0.measures.q: Input should be 'sum', 'count', 'min' or 'max' (got 'avg')"),
    ({"sinks": [{"name": "x", "table": "a.b.c", "mode": "append"}]}, "sinks.0.table: String should match pattern"),
    ({"sinks": [VALID["sinks"][0], VALID["sinks"][0]]}, "sink names must be unique, repeated: ['totals']"),
    ({"on_bad_record": "ignore"}, "on_bad_record: Input should be 'dead_letter' or 'fail' (got 'ignore')"),
    ({"max_records_per_run": 0}, "max_records_per_run: Input should be greater than 0 (got 0)"),
    ({"lease": "PT0S"}, "lease: Input should be greater than 0 seconds"),
    ({"transform": "not a function"}, "transform: String should match pattern"),
    ({"source": {"topics": [], "value_schema": {"a": "int"}}}, "source.topics: Tuple should have at least 1 item"),
    ({"source": {"topics": ["t"], "value_schema": {"a": "int"}, "start": "yesterday"}}, "source.start"),
    ({"surprise": 1}, "surprise: Extra inputs are not permitted (got 1)"),
    ({"sinks": [{"name": n, "table": f"demo.{n}", "mode": "kafka", "topic": n, "keys": ["sku"],
                 "progress_topic": "progress"} for n in ("a", "b")]},
     "kafka sinks share progress_topic ['progress']: each sink needs a progress topic of its own"),
])
def test_invalid_values_name_the_field_and_the_value(changes, message):
    with pytest.raises(ConfigError) as error:
        load_config(with_changes(**changes))
    assert message in str(error.value)
    assert str(error.value).startswith("pipeline config ")


def test_a_value_type_that_is_not_exactly_one_spark_type_is_refused():
    source = {"topics": ["t"], "value_schema": {"sku": "string", "qty": "int, x string"}}
    with pytest.raises(ConfigError) as error:
        load_config(with_changes(source=source))
    assert "source.value_schema.qty: " in str(error.value)
    assert "(got 'int, x string')" in str(error.value)
    assert "expected the end of the type, found ',' at position 3" in str(error.value)
    # a valid type is kept as written
    source["value_schema"]["qty"] = "DECIMAL(12, 2)"
    assert load_config(with_changes(source=source)).source.value_schema["qty"] == "DECIMAL(12, 2)"


def test_a_stored_version_is_loaded_without_the_rules_of_this_release():
    """Issue 60, item 1: a version the ledger recorded is the contract it ran under; a rule
    added since (several topics need an upsert's order_by) does not refuse it."""
    older = with_changes(source={"topics": ["a", "b"], "value_schema": {"sku": "string", "qty": "int"}},
                         sinks=[{"name": "last", "table": "demo.last", "mode": "upsert", "keys": ["sku"]}])
    with pytest.raises(ConfigError, match="sinks.0.order_by: sink 'last' is an upsert sink ordered by offset"):
        load_config(older)
    assert load_stored_config(older).sink("last").order_by is None
    with pytest.raises(ConfigError, match="sinks.0.mode: unknown sink mode"):  # what it cannot run is refused
        load_stored_config(with_changes(sinks=[{"name": "x", "table": "demo.x", "mode": "merge"}]))
