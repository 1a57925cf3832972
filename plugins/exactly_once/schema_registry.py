"""A schema registry's Confluent-compatible REST API, as an Airflow connection of type `http`
holds it (e.g. `schema_registry_default`, named by a pipeline's `source.schema_registry`): its
extra is confluent-kafka's SchemaRegistryClient config — `url` (Apicurio Registry serves the API
under `/apis/ccompat/v7`; without it, the connection's schema://host:port) and TLS in the Kafka
connection's names (`ssl.ca.location`/`ssl.ca.pem`, `ssl.certificate.*` and `ssl.key.*` for
mutual TLS, `ssl.endpoint.identification.algorithm`; `exactly_once.tls`) — and its login and
password are HTTP basic auth.

The preflight asks it for its subjects (`problems`): a login it refuses or a certificate that
fails verification is a problem no retry fixes; a registry that does not answer, or answers
with a server error, may pass by itself.
"""

from __future__ import annotations

import base64
import json
import ssl
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from exactly_once import tls
from exactly_once.errors import ConfigError
from exactly_once.problems import Problem

URL = "url"
ACCEPT = "application/vnd.schemaregistry.v1+json, application/json"


@dataclass(frozen=True)
class SchemaRegistry:
    connection: str                                                  # the Airflow connection, named in errors
    url: str                                                         # the API's root
    login: tuple[str, str] | None = field(default=None, repr=False)  # HTTP basic auth
    tls_settings: Mapping[str, str] = field(default_factory=dict, repr=False)

    def validate(self) -> SchemaRegistry:
        """ConfigError naming the connection unless its URL and TLS settings can be used."""
        if not self.url.startswith(("https://", "http://")):
            raise ConfigError(f"connection {self.connection!r}: the schema registry's URL {self.url!r} is not "
                              "http(s)://host:port[/path] (the extra's 'url', or the connection's schema, host, port)")
        unknown = sorted(set(self.tls_settings) - set(tls.SETTINGS) - {tls.NO_HOST_CHECK[0]})
        if unknown:
            raise ConfigError(f"connection {self.connection!r}: {unknown[0]!r} is no schema registry setting this "
                              f"library knows; its extra carries {', '.join([URL, *tls.SETTINGS, tls.NO_HOST_CHECK[0]])}"
                              " (the login and password are the connection's own fields)")
        if self.url.startswith("https://"):
            tls.client_context(self.connection, self.tls_settings)  # a file or key that cannot be read
        return self

    def portable(self) -> SchemaRegistry:
        """This registry with its PEM files' contents inline, for a Spark job that cannot read the task's files."""
        return replace(self, tls_settings=tls.inline(self.connection, self.tls_settings))

    def secrets(self) -> list[str]:
        """The values that are secret: the password, the client key and its password."""
        return [s for s in (self.login[1] if self.login else "", *tls.secrets(self.tls_settings)) if s]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def of_dict(cls, found: Mapping[str, Any]) -> SchemaRegistry:
        login = found["login"]
        return cls(found["connection"], found["url"], tuple(login) if login else None, found["tls_settings"])

    def get(self, path: str, timeout: float = 10, body: Any = None) -> Any:
        """The JSON the registry answers to GET `path` (POST of `body` as JSON, if given);
        urllib's errors as they are."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url.rstrip("/") + path, data=data, headers={
            "Accept": ACCEPT, **({} if data is None else {"Content-Type": "application/vnd.schemaregistry.v1+json"})})
        if self.login is not None:
            token = base64.b64encode(":".join(self.login).encode()).decode()
            request.add_header("Authorization", f"Basic {token}")
        context = tls.client_context(self.connection, self.tls_settings) if self.url.startswith("https") else None
        with urllib.request.urlopen(request, context=context, timeout=timeout) as response:
            return json.load(response)

    def problems(self) -> list[Problem]:
        """What keeps the pipeline from using the registry, asked of the registry itself."""
        subject = f"connection {self.connection!r}"
        try:
            self.get("/subjects")
        except urllib.error.HTTPError as refused:
            if refused.code in (401, 403):
                return [Problem(subject, f"the schema registry {self.url} refuses its login: HTTP {refused.code} "
                                         f"{refused.reason}")]
            if refused.code == 404:
                return [Problem(subject, f"no Confluent-compatible schema registry API at {self.url} (HTTP 404 for "
                                         "/subjects; Apicurio Registry serves it under /apis/ccompat/v7)")]
            return [Problem(subject, f"the schema registry {self.url} answers HTTP {refused.code} {refused.reason}",
                            passing=refused.code >= 500)]
        except urllib.error.URLError as failed:
            if isinstance(failed.reason, ssl.SSLCertVerificationError):
                return [Problem(subject, f"the schema registry {self.url}'s certificate fails verification with the "
                                         f"connection's CA: {failed.reason.verify_message}")]
            return [Problem(subject, f"the schema registry {self.url} does not answer: {failed.reason}", passing=True)]
        except (OSError, ValueError) as failed:  # a timeout while reading; an answer that is not JSON
            return [Problem(subject, f"the schema registry {self.url} does not answer as one: {failed}",
                            passing=isinstance(failed, OSError))]
        return []
