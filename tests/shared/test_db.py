"""libpq URI -> Spark JDBC options: nothing the URI says is dropped or misread on the way."""

from urllib.parse import parse_qsl, urlsplit

import pytest

from exactly_once.db import jdbc_options


def jdbc_query(options: dict[str, str]) -> dict[str, str]:
    """The JDBC URL's parameters, decoded as pgjdbc decodes them (URLDecoder: %XX and '+')."""
    query = urlsplit(options["url"].removeprefix("jdbc:")).query
    return dict(parse_qsl(query, keep_blank_values=True, strict_parsing=True))


def test_a_plain_url():
    assert jdbc_options("postgresql://u:pw@db.example:6543/pipeline") == {
        "url": "jdbc:postgresql://db.example:6543/pipeline?reWriteBatchedInserts=true",
        "user": "u",
        "password": "pw",
        "driver": "org.postgresql.Driver",
    }


def test_the_port_defaults_to_5432():
    assert jdbc_options("postgres://u@h/db")["url"] == "jdbc:postgresql://h:5432/db?reWriteBatchedInserts=true"


def test_percent_encoded_user_password_and_database_are_decoded():
    options = jdbc_options("postgresql://us%3Aer:p%40ss%2Fw%25rd@h/my%20db")
    assert (options["user"], options["password"]) == ("us:er", "p@ss/w%rd")
    # pgjdbc URL-decodes the database name: it is re-encoded for it
    assert options["url"].startswith("jdbc:postgresql://h:5432/my%20db?")


def test_a_plus_in_the_password_stays_a_plus():
    # libpq decodes %XX only; '+' is not a space in a libpq URI
    assert jdbc_options("postgresql://u:a+b@h/db")["password"] == "a+b"


def test_user_password_and_dbname_may_come_from_the_query():
    options = jdbc_options("postgresql://h:5433?dbname=pipe&user=u&password=p%26q")
    assert options["url"] == "jdbc:postgresql://h:5433/pipe?reWriteBatchedInserts=true"
    assert (options["user"], options["password"]) == ("u", "p&q")


def test_an_ipv6_host_keeps_its_brackets():
    assert jdbc_options("postgresql://u@[::1]:5433/db")["url"].startswith("jdbc:postgresql://[::1]:5433/db?")


def test_ssl_parameters_are_carried():
    options = jdbc_options(
        "postgresql://u:p@h/db?sslmode=verify-full&sslrootcert=/etc/ssl/root%20ca.pem"
        "&sslcert=/c/client.crt&sslkey=/c/client.pk8&sslpassword=s%26cret")
    assert jdbc_query(options) == {
        "reWriteBatchedInserts": "true",
        "sslmode": "verify-full",
        "sslrootcert": "/etc/ssl/root ca.pem",
        "sslcert": "/c/client.crt",
        "sslkey": "/c/client.pk8",
        "sslpassword": "s&cret",
    }


def test_renamed_parameters_and_values_that_need_encoding():
    options = jdbc_options(
        "postgresql://u:p@h/db?application_name=orders%20loader&options=-c%20search_path%3Dstaging,public"
        "%20-c%20statement_timeout%3D5min&connect_timeout=7&channel_binding=require"
        "&gssencmode=disable&sslnegotiation=postgres&krbsrvname=pg&keepalives=0")
    assert jdbc_query(options) == {
        "reWriteBatchedInserts": "true",
        "ApplicationName": "orders loader",
        "options": "-c search_path=staging,public -c statement_timeout=5min",
        "connectTimeout": "7",
        "channelBinding": "require",
        "gssEncMode": "disable",
        "sslNegotiation": "postgres",
        "kerberosServerName": "pg",
        "tcpKeepAlive": "false",
    }
    # '+', '&', '=' and '%' in a value survive pgjdbc's URLDecoder
    tricky = jdbc_options("postgresql://h/db?application_name=a%2Bb%26c%3Dd%25e")
    assert jdbc_query(tricky)["ApplicationName"] == "a+b&c=d%e"
    assert "+" not in tricky["url"] and " " not in tricky["url"]


@pytest.mark.parametrize(("libpq", "jdbc"), [
    ("any", "any"),
    ("read-write", "primary"),  # pgjdbc primary: not in hot standby and transaction_read_only off
    ("read-only", "secondary"),  # pgjdbc secondary: everything else
])
def test_target_session_attrs_map_to_target_server_type(libpq, jdbc):
    assert jdbc_query(jdbc_options(f"postgresql://h/db?target_session_attrs={libpq}"))["targetServerType"] == jdbc


def test_a_non_positive_connect_timeout_means_wait_forever_in_both():
    assert jdbc_query(jdbc_options("postgresql://h/db?connect_timeout=-1"))["connectTimeout"] == "0"


def test_libpqs_jdbc_compatible_ssl_true_means_sslmode_require():
    assert jdbc_query(jdbc_options("postgresql://h/db?ssl=true"))["sslmode"] == "require"


@pytest.mark.parametrize(("url", "message"), [
    ("postgresql://h/db?sslcrl=/c/root.crl", "sslcrl"),
    ("postgresql://h/db?sslmode=require&client_encoding=latin1", "client_encoding"),
    ("postgresql://h/db?service=pipeline", "service"),
    ("postgresql://h/db?target_session_attrs=standby", "target_session_attrs=standby"),
    ("postgresql://h/db?target_session_attrs=prefer-standby", "target_session_attrs=prefer-standby"),
    ("postgresql://h/db?sslrootcert=system", "sslrootcert=system"),
    ("postgresql://h/db?connect_timeout=soon", "connect_timeout"),
    ("postgresql://h/db?keepalives=yes", "keepalives"),
    ("postgresql://h/db?ssl=false", "ssl"),
    ("postgresql://h/db?host=/var/run/postgresql", "host"),
    ("postgresql:///db", "host"),
    ("postgresql://h/db?sslmode", "sslmode"),
    ("mysql://h/db", "postgresql://"),
])
def test_a_parameter_pgjdbc_cannot_honour_is_refused_by_name(url, message):
    with pytest.raises(ValueError, match="(?s)" + message.replace("?", r"\?")):
        jdbc_options(url)


def test_several_hosts_and_host_port_from_the_query():
    assert jdbc_options("postgresql://u@h1:5433,[::1],h3:6000/db?target_session_attrs=read-write")["url"] == (
        "jdbc:postgresql://h1:5433,[::1]:5432,h3:6000/db?reWriteBatchedInserts=true&targetServerType=primary")
    assert jdbc_options("postgresql:///db?host=a,b&port=7000")["url"].startswith("jdbc:postgresql://a:7000,b:7000/db?")


@pytest.mark.parametrize(("url", "message"), [
    ("postgresql://u:p%zzw@h/db", "password: invalid percent-encoding"),
    ("postgresql://u@h:54x/db", "port"),
    ("postgresql://h/db?options=-c%20a=b", "options: a second '='"),
    ("postgresql://h/db?port=1,2&host=a,b,c", "port: 2 ports for 3 hosts"),
])
def test_a_malformed_url_is_refused(url, message):
    with pytest.raises(ValueError, match=message):
        jdbc_options(url)


def test_errors_never_quote_the_password():
    with pytest.raises(ValueError) as refused:
        jdbc_options("postgresql://u:s3cret@h/db?sslcrl=x")
    assert "s3cret" not in str(refused.value)
