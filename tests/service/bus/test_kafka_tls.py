"""Kafka over TLS with a client certificate (mutual TLS, as Strimzi's `tls` users connect).

The broker used in tests (tansu 0.6) does not complete a TLS handshake, so the broker's side is a
TLS server of the test's own that requires a client certificate from the test CA and records who
connected; the client is kafka-python built from ragmon's `client_settings`, as the service builds
it. What is checked is the TLS part only: the Kafka protocol after the handshake is not spoken.
Certificates come from the `openssl` command; without it these tests skip.
"""

from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaAdminClient
from kafka.errors import KafkaError

from service.bus.kafka_client import client_settings
from service.config import ConfigError, KafkaConfig, load_config

OPENSSL = shutil.which("openssl")
pytestmark = pytest.mark.skipif(
    OPENSSL is None, reason="the openssl command is needed to make test certificates"
)
KEY_PASSWORD = "key-pass-5e3c"


def _openssl(*args: str, cwd: Path) -> None:
    assert OPENSSL is not None
    subprocess.run([OPENSSL, *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA, a broker certificate for 127.0.0.1, a client certificate (CN ragmon) with a plain key
    and the same key encrypted, and a client certificate from a CA the broker does not trust."""
    d = tmp_path_factory.mktemp("pki")
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n", encoding="utf-8")
    for ca in ("ca", "other-ca"):
        _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{ca}.key", "-out", f"{ca}.crt",
                 "-days", "2", "-subj", f"/CN={ca}", cwd=d)  # fmt: skip
    for name, ca, subject, ext in (
        ("broker", "ca", "/CN=127.0.0.1", ["-extfile", "san.ext"]),
        ("client", "ca", "/CN=ragmon", []),
        ("stranger", "other-ca", "/CN=stranger", []),
    ):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
                 "-subj", subject, cwd=d)  # fmt: skip
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key",
                 "-CAcreateserial", "-out", f"{name}.crt", "-days", "2", *ext, cwd=d)  # fmt: skip
    _openssl("pkey", "-in", "client.key", "-out", "client-encrypted.key", "-aes256", "-passout",
             f"pass:{KEY_PASSWORD}", cwd=d)  # fmt: skip
    return d


class MutualTlsServer:
    """Accepts TLS connections that present a client certificate signed by the CA; records the
    client certificate's common name of each completed handshake, and each refused one."""

    def __init__(self, pki: Path) -> None:
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.load_cert_chain(pki / "broker.crt", pki / "broker.key")
        self.context.load_verify_locations(pki / "ca.crt")
        self.context.verify_mode = ssl.CERT_REQUIRED
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.clients: list[str] = []
        self.refused: list[str] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            try:
                with self.context.wrap_socket(conn, server_side=True) as tls:
                    subject = dict(pair[0] for pair in tls.getpeercert()["subject"])  # type: ignore[index]
                    self.clients.append(str(subject["commonName"]))
            except (ssl.SSLError, OSError) as exc:
                self.refused.append(type(exc).__name__)

    def close(self) -> None:
        self.listener.close()
        self._thread.join(5)


@pytest.fixture
def broker(pki: Path) -> Iterator[MutualTlsServer]:
    server = MutualTlsServer(pki)
    try:
        yield server
    finally:
        server.close()


def _connect(config: KafkaConfig) -> None:
    """Bootstrap a kafka-python client with ragmon's settings; the handshake is all that can pass."""
    with pytest.raises(KafkaError):
        KafkaAdminClient(client_id="ragmon-test", **client_settings(config))


def _config(broker: MutualTlsServer, **settings: Any) -> KafkaConfig:
    return KafkaConfig(
        bootstrap_servers=[f"127.0.0.1:{broker.port}"],
        security_protocol="SSL",
        request_timeout_s=1.0,
        **settings,
    )


def test_the_client_certificate_from_the_settings_is_presented(broker: MutualTlsServer, pki: Path) -> None:
    _connect(
        _config(
            broker,
            ssl_cafile=str(pki / "ca.crt"),
            ssl_certfile=str(pki / "client.crt"),
            ssl_keyfile=str(pki / "client.key"),
        )
    )
    assert broker.clients and set(broker.clients) == {"ragmon"}


def test_an_encrypted_key_opens_with_ssl_password(broker: MutualTlsServer, pki: Path) -> None:
    _connect(
        _config(
            broker,
            ssl_cafile=str(pki / "ca.crt"),
            ssl_certfile=str(pki / "client.crt"),
            ssl_keyfile=str(pki / "client-encrypted.key"),
            ssl_password=KEY_PASSWORD,
        )
    )
    assert broker.clients and set(broker.clients) == {"ragmon"}


def test_without_a_client_certificate_the_broker_refuses(broker: MutualTlsServer, pki: Path) -> None:
    _connect(_config(broker, ssl_cafile=str(pki / "ca.crt")))
    assert broker.clients == []
    assert broker.refused, "the client did reach the broker"


def test_a_certificate_from_another_ca_is_refused(broker: MutualTlsServer, pki: Path) -> None:
    _connect(
        _config(
            broker,
            ssl_cafile=str(pki / "ca.crt"),
            ssl_certfile=str(pki / "stranger.crt"),
            ssl_keyfile=str(pki / "stranger.key"),
        )
    )
    assert broker.clients == []
    assert broker.refused


def test_tls_settings_come_from_the_environment_and_the_key_password_stays_secret() -> None:
    config = load_config(
        environ={
            "RAGMON_KAFKA__SECURITY_PROTOCOL": '"SSL"',
            "RAGMON_KAFKA__SSL_CERTFILE": '"/etc/ragmon/kafka-client/user.crt"',
            "RAGMON_KAFKA__SSL_KEYFILE": '"/etc/ragmon/kafka-client/user.key"',
            "RAGMON_KAFKA__SSL_PASSWORD": "1234",
        }
    )
    settings = client_settings(config.kafka)
    assert settings["ssl_certfile"] == "/etc/ragmon/kafka-client/user.crt"
    assert settings["ssl_keyfile"] == "/etc/ragmon/kafka-client/user.key"
    assert settings["ssl_password"] == "1234"  # digits stay a string
    assert settings["ssl_check_hostname"] is True
    assert "1234" not in repr(config.kafka)
    with pytest.raises(ConfigError, match="ssl_certfile"):
        load_config(environ={"RAGMON_KAFKA__SSL_KEYFILE": '"/k.pem"'})


@pytest.mark.parametrize("key", ["client.key", "client-encrypted.key", "in the certificate file"])
def test_librdkafka_presents_the_client_certificate_from_the_same_settings(
    broker: MutualTlsServer, pki: Path, key: str, tmp_path: Path
) -> None:
    """`kafka.producer_client: librdkafka` reads the same settings: the broker sees the client
    certificate (CN ragmon) with a plain key, an encrypted one (`ssl_password`) and a key kept in the
    certificate's own file; the Kafka protocol after the handshake fails, as the producer reports."""
    pytest.importorskip("confluent_kafka", reason="confluent-kafka comes with the kafka extra")
    from service.bus.librdkafka_producer import LibrdkafkaError, LibrdkafkaProducer

    if key == "in the certificate file":
        both = tmp_path / "client-with-key.pem"
        both.write_bytes((pki / "client.crt").read_bytes() + (pki / "client.key").read_bytes())
        files: dict[str, Any] = {"ssl_certfile": str(both)}
    else:
        files = {"ssl_certfile": str(pki / "client.crt"), "ssl_keyfile": str(pki / key)}
        if key == "client-encrypted.key":
            files["ssl_password"] = KEY_PASSWORD
    producer = LibrdkafkaProducer(_config(broker, ssl_cafile=str(pki / "ca.crt"), **files))
    try:
        with pytest.raises(LibrdkafkaError):
            producer.partition_count("spans")
    finally:
        closer = producer.abort()
        if closer is not None:
            closer.join(10)
    assert broker.clients and set(broker.clients) == {"ragmon"}
