"""The local stack's private certificate authority and the certificates it signs.

`ensure()` makes, once per checkout, into .local/tls (settings.TLS) a CA and five leaf
certificates: four for the Kafka broker's TLS listeners, `broker` (IP 127.0.0.1, DNS localhost),
`broker-expired` (same names, expired), `broker-other-host` (only DNS kafka.other-host.example)
and `client` (CN=pipeline, for mutual TLS); and `postgres` (IP 127.0.0.1, DNS localhost), the
local PostgreSQL server's, which its clients check with `sslmode=verify-full`. They are kept
and reused; only what is missing, or a certificate meant to be valid that expires within 30
days, is made again. `make_ca()`
and `make_leaf()` make the same into any folder (the tests make an unrelated CA with them).

Each leaf is three files: `<name>.key` (its private key), `<name>.pem` (its certificate and
the CA's, the chain a TLS peer presents) and `<name>.keystore.pem` (key and chain in one file,
what Java's `ssl.keystore.type=PEM` reads: the broker, and a Java client such as Spark's).
Keys are unencrypted PKCS#8, the one PEM key form both librdkafka and Java read.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

RENEW_BEFORE = datetime.timedelta(days=30)
CA_LIFETIME = datetime.timedelta(days=3650)
LEAF_LIFETIME = datetime.timedelta(days=397)
# Backdated, so that a clock a little behind the one that signed still accepts them.
BACKDATE = datetime.timedelta(days=1)


@dataclass(frozen=True)
class TlsFiles:
    """The files of one CA and its leaves in `folder`."""

    folder: Path

    @property
    def ca(self) -> Path:
        return self.folder / "ca.pem"

    @property
    def ca_key(self) -> Path:
        return self.folder / "ca.key"

    def certificate(self, leaf: str) -> Path:
        return self.folder / f"{leaf}.pem"

    def key(self, leaf: str) -> Path:
        return self.folder / f"{leaf}.key"

    def keystore(self, leaf: str) -> Path:
        return self.folder / f"{leaf}.keystore.pem"

    @property
    def client_certificate(self) -> Path:
        return self.certificate("client")

    @property
    def client_key(self) -> Path:
        return self.key("client")


@dataclass(frozen=True)
class Leaf:
    common_name: str
    dns: tuple[str, ...] = ()
    ips: tuple[str, ...] = ()
    client: bool = False  # for a client's side of mutual TLS, else a server's
    expired: bool = False  # expired on purpose: the tests' refusal of an expired certificate


# The names a client on this machine reaches the broker and PostgreSQL by: verify-full checks them.
LOOPBACK_NAMES = {"dns": ("localhost",), "ips": ("127.0.0.1",)}
STACK_LEAVES = {
    "broker": Leaf("localhost", **LOOPBACK_NAMES),
    "broker-expired": Leaf("localhost", **LOOPBACK_NAMES, expired=True),
    "broker-other-host": Leaf("kafka.other-host.example", dns=("kafka.other-host.example",)),
    "client": Leaf("pipeline", client=True),
    "postgres": Leaf("localhost", **LOOPBACK_NAMES),
}


def ensure(files: TlsFiles) -> TlsFiles:
    """The stack's CA and leaves in `files.folder`, each made only if missing or due for renewal."""
    if _due(files.ca, files.ca_key):
        make_ca(files.folder, "exactly-once local stack CA")
        due = STACK_LEAVES  # the old leaves are signed by a key that is gone
    else:
        due = {name: leaf for name, leaf in STACK_LEAVES.items()
               if _due(files.certificate(name), files.key(name), files.keystore(name), expired=leaf.expired)}
    for name, leaf in due.items():
        make_leaf(files, name, leaf)
    return files


def make_ca(folder: Path, common_name: str) -> TlsFiles:
    """A new self-signed CA (ca.pem, ca.key) in `folder`, replacing any there."""
    files = TlsFiles(folder)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = _now()
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - BACKDATE).not_valid_after(now + CA_LIFETIME)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(_key_usage(ca=True), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    _mkdir(folder)
    _write(files.ca_key, _pkcs8(key), private=True)
    _write(files.ca, cert.public_bytes(serialization.Encoding.PEM))
    return files


def make_leaf(files: TlsFiles, name: str, leaf: Leaf) -> None:
    """`name`'s key, certificate chain and keystore in `files.folder`, signed by its CA."""
    ca_key = serialization.load_pem_private_key(files.ca_key.read_bytes(), password=None)
    ca_cert = x509.load_pem_x509_certificate(files.ca.read_bytes())
    key = ec.generate_private_key(ec.SECP256R1())
    now = _now()
    start, end = (now - datetime.timedelta(days=60), now - BACKDATE) if leaf.expired else (
        now - BACKDATE, now + LEAF_LIFETIME)
    usage = ExtendedKeyUsageOID.CLIENT_AUTH if leaf.client else ExtendedKeyUsageOID.SERVER_AUTH
    builder = (x509.CertificateBuilder()
               .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, leaf.common_name)]))
               .issuer_name(ca_cert.subject).public_key(key.public_key())
               .serial_number(x509.random_serial_number()).not_valid_before(start).not_valid_after(end)
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
               .add_extension(_key_usage(ca=False), critical=True)
               .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
               .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                              critical=False))
    if leaf.dns or leaf.ips:
        builder = builder.add_extension(x509.SubjectAlternativeName(
            [x509.DNSName(d) for d in leaf.dns] + [x509.IPAddress(ipaddress.ip_address(i)) for i in leaf.ips]),
            critical=False)
    chain = (builder.sign(ca_key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)
             + ca_cert.public_bytes(serialization.Encoding.PEM))
    _write(files.key(name), _pkcs8(key), private=True)
    _write(files.certificate(name), chain)
    _write(files.keystore(name), _pkcs8(key) + chain, private=True)


def _due(cert: Path, *others: Path, expired: bool = False) -> bool:
    """A file is missing, or the certificate (unless expired on purpose) expires within RENEW_BEFORE."""
    if not all(path.exists() for path in (cert, *others)):
        return True
    return not expired and x509.load_pem_x509_certificate(cert.read_bytes()).not_valid_after_utc < _now() + RENEW_BEFORE


def _key_usage(ca: bool) -> x509.KeyUsage:
    return x509.KeyUsage(digital_signature=not ca, content_commitment=False, key_encipherment=False,
                         data_encipherment=False, key_agreement=False, key_cert_sign=ca, crl_sign=ca,
                         encipher_only=False, decipher_only=False)


def _pkcs8(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def _mkdir(folder: Path) -> None:
    # 0700 at creation: nobody else may list or read the keys, not even for an instant.
    folder.parent.mkdir(parents=True, exist_ok=True)
    folder.mkdir(mode=0o700, exist_ok=True)


def _write(path: Path, data: bytes, private: bool = False) -> None:
    """Writes a new file under a temporary name, then renames it over `path`: a key is 0600 from
    its first byte (a chmod after writing leaves a window), and a reader never sees half a file."""
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.unlink(missing_ok=True)
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    os.replace(temporary, path)
