"""The pipeline database's libpq URI as Spark's JDBC writer needs it (pgjdbc options)."""

from __future__ import annotations

import re
from urllib.parse import quote, unquote

from exactly_once.errors import ConfigError

# libpq URI query parameters that pgjdbc has under the same meaning: libpq keyword ->
# pgjdbc connection property (org.postgresql.PGProperty, checked against pgjdbc 42.7.8).
# Their values mean the same to both and are passed as they are.
_SAME_MEANING = {
    "sslmode": "sslmode",                    # disable|allow|prefer|require|verify-ca|verify-full
    "sslcert": "sslcert",
    "sslkey": "sslkey",                      # pgjdbc reads PKCS#8 DER (.pk8) or PKCS#12 keys, not PEM
    "sslrootcert": "sslrootcert",
    "sslpassword": "sslpassword",
    "sslnegotiation": "sslNegotiation",      # postgres|direct
    "gssencmode": "gssEncMode",              # disable|prefer|require
    "channel_binding": "channelBinding",     # disable|prefer|require
    "krbsrvname": "kerberosServerName",
    "application_name": "ApplicationName",
    "options": "options",
}
# target_session_attrs -> targetServerType. pgjdbc counts a server as primary when it is
# not in hot standby and `SHOW transaction_read_only` is off (ConnectionFactoryImpl.isPrimary):
# libpq's read-write; anything else is pgjdbc's secondary: libpq's read-only. libpq's
# primary/standby/prefer-standby look at hot standby only: pgjdbc has no such setting.
_TARGET_SERVER_TYPE = {"any": "any", "read-write": "primary", "read-only": "secondary"}
# Parameters jdbc_options reads itself (from the URI's parts or its query).
_CONNECTION = ("host", "port", "dbname", "user", "password")
_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})|%00")


def jdbc_options(libpq_url: str) -> dict[str, str]:
    """Spark JDBC options for the database of a libpq URI
    (`postgresql://[user[:password]@][host][:port][,...][/dbname][?param=value&...]`).
    The COPY staging writer (jvm/) connects with its url, user and password; batched inserts
    are rewritten into multi-row INSERTs for Spark's JDBC writer (the stack's smoke job, the
    benchmarks' Structured Streaming peer). Query parameters are carried over as the pgjdbc
    properties that mean the same; one pgjdbc cannot honour raises ConfigError (no retry fixes
    it) naming it (messages never quote the URI, which holds the password)."""
    scheme, sep, rest = libpq_url.partition("://")
    if not sep or scheme not in ("postgresql", "postgres"):
        raise ConfigError("the database URL must be a libpq URI starting with postgresql:// or postgres://")
    rest, _, query = rest.partition("?")
    netloc, slash, path = rest.partition("/")
    userinfo, at, hostport = netloc.rpartition("@")
    found = {"host": None, "port": None, "dbname": _decode(path, "dbname") if slash else None,
             "user": None, "password": None}
    if at:
        user, colon, password = userinfo.partition(":")
        found["user"] = _decode(user, "user")
        found["password"] = _decode(password, "password") if colon else None
    hosts = _hosts(hostport)

    properties = {"reWriteBatchedInserts": "true"}
    for keyword, value in _query(query):
        if keyword in _CONNECTION:
            found[keyword] = value
        else:
            name, converted = _property(keyword, value)
            properties[name] = converted
    if found["host"] is not None or found["port"] is not None:
        hosts = _override(hosts, found["host"], found["port"])
    for host, _port in hosts:
        if not host:
            raise ConfigError("host: the database URL names no host; libpq would use a Unix-domain socket, "
                             "which pgjdbc cannot")
        if host.startswith("/"):
            raise ConfigError("host: a Unix-domain socket directory; pgjdbc connects over TCP only")

    address = ",".join(f"[{h}]:{p or 5432}" if ":" in h else f"{h}:{p or 5432}" for h, p in hosts)
    parameters = "&".join(f"{k}={quote(v, safe='')}" for k, v in properties.items())
    return {
        # pgjdbc URL-decodes the database name and the parameter values ('+' as a space)
        "url": f"jdbc:postgresql://{address}/{quote(found['dbname'] or '', safe='')}?{parameters}",
        "user": found["user"] or "",
        "password": found["password"] or "",
        "driver": "org.postgresql.Driver",
    }


def _decode(text: str, what: str) -> str:
    """libpq's URI decoding: %XX escapes only ('+' stays '+'); a bad escape is an error."""
    if _BAD_ESCAPE.search(text):
        raise ConfigError(f"{what}: invalid percent-encoding in the database URL")
    try:
        return unquote(text, errors="strict")
    except UnicodeDecodeError:
        raise ConfigError(f"{what}: percent-encoding in the database URL is not UTF-8") from None


def _hosts(hostport: str) -> list[tuple[str, str]]:
    """`host[:port]` items of the URI's comma-separated host list ('[v6]:port' for IPv6)."""
    hosts = []
    for item in hostport.split(","):
        if item.startswith("["):
            host, bracket, after = item[1:].partition("]")
            if not bracket or (after and not after.startswith(":")):
                raise ConfigError("host: malformed IPv6 address in the database URL")
            port = after[1:]
        else:
            host, _, port = item.partition(":")
            host = _decode(host, "host")
        hosts.append((host, _port(port)))
    return hosts


def _override(hosts: list[tuple[str, str]], host: str | None, port: str | None) -> list[tuple[str, str]]:
    """host= and port= query parameters (comma-separated lists, as libpq takes them)."""
    names = host.split(",") if host is not None else [h for h, _ in hosts]
    if port is None:
        ports = [p for _, p in hosts] if len(hosts) == len(names) else [""] * len(names)
    else:
        ports = [_port(p) for p in port.split(",")]
        if len(ports) == 1:
            ports *= len(names)
        elif len(ports) != len(names):
            raise ConfigError(f"port: {len(ports)} ports for {len(names)} hosts")
    return list(zip(names, ports))


def _port(port: str) -> str:
    if port and not (port.isascii() and port.isdigit() and 0 < int(port) < 65536):
        raise ConfigError(f"port: not a TCP port number: {port!r}")
    return port


def _query(query: str) -> list[tuple[str, str]]:
    """The query's (keyword, value) pairs, decoded as libpq decodes them."""
    if not query:
        return []
    pairs = []
    for item in query.split("&"):
        keyword, equals, value = item.partition("=")
        if not equals:
            raise ConfigError(f"{_decode(keyword, 'a query parameter')}: no '=value' in the database URL's query")
        if "=" in value:
            raise ConfigError(f"{_decode(keyword, 'a query parameter')}: a second '=' in its value "
                             "(percent-encode it as %3D)")
        keyword = _decode(keyword, "a query parameter")
        pairs.append((keyword, _decode(value, keyword)))
    return pairs


def _property(keyword: str, value: str) -> tuple[str, str]:
    """The pgjdbc property and value for a libpq query parameter, or ValueError."""
    if keyword == "ssl":  # libpq takes ssl=true (only) from JDBC URLs: sslmode=require
        if value != "true":
            raise ConfigError(f"ssl={value}: libpq accepts only ssl=true (meaning sslmode=require)")
        return "sslmode", "require"
    if keyword == "sslrootcert" and value == "system":
        raise ConfigError("sslrootcert=system: libpq's system CA store has no pgjdbc equivalent; "
                         "name a root certificate file")
    if keyword in _SAME_MEANING:
        return _SAME_MEANING[keyword], value
    if keyword == "connect_timeout":  # seconds in both; libpq waits forever for <= 0, pgjdbc for 0
        try:
            seconds = int(value.strip())
        except ValueError:
            raise ConfigError(f"connect_timeout: not a whole number of seconds: {value!r}") from None
        return "connectTimeout", str(max(seconds, 0))
    if keyword == "keepalives":
        if value not in ("0", "1"):
            raise ConfigError(f"keepalives: expected 0 or 1, got {value!r}")
        return "tcpKeepAlive", "true" if value == "1" else "false"
    if keyword == "target_session_attrs":
        if value not in _TARGET_SERVER_TYPE:
            raise ConfigError(f"target_session_attrs={value}: pgjdbc's targetServerType has no equivalent; "
                             f"use one of {', '.join(_TARGET_SERVER_TYPE)}")
        return "targetServerType", _TARGET_SERVER_TYPE[value]
    raise ConfigError(f"{keyword}: a database URL parameter that pgjdbc has no equivalent for (Spark's JDBC "
                     f"writer would ignore it); it takes {', '.join(sorted(_SAME_MEANING))}, ssl=true, "
                     "connect_timeout, keepalives, target_session_attrs, host, port, dbname, user, password")
