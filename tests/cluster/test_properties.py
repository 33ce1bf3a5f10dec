"""Kafka client property names (Java / librdkafka / kcat / Spark's ``kafka.*``) ->
ClusterConfig options: JAAS lines, stores, hostname checking, and errors that never
quote a secret. Also the CLI's ``-X`` / ``--config FILE`` collection and its echo."""

from __future__ import annotations

import argparse
import logging
import pickle
from pathlib import Path

import pytest

from pipeline.cli._common import (
    UserError,
    add_bootstrap,
    add_producer_options,
    cluster_options,
    producer_options,
    read_properties,
    resolve_bootstrap,
)
from pipeline.cluster.config import ClusterConfig, cluster_config
from pipeline.cluster.errors import ConfigError
from pipeline.cluster.properties import kafka_properties, parse_jaas
from pipeline.testing.kafka.security import Pki

SECRET = "s3cr3t-Pa55"
PLAIN_JAAS = (f'org.apache.kafka.common.security.plain.PlainLoginModule required '
              f'username="alice" password="{SECRET}";')
SCRAM_JAAS = (f"kafkashaded.org.apache.kafka.common.security.scram.ScramLoginModule "
              f"required username='bob' password='{SECRET}';")


def test_plain_jaas_line_sets_mechanism_user_and_password() -> None:
    opts, rest = kafka_properties({"security.protocol": "SASL_SSL",
                                   "sasl.jaas.config": PLAIN_JAAS, "linger": "0.1"})
    assert opts == {"security_protocol": "SASL_SSL", "sasl_mechanism": "PLAIN",
                    "sasl_username": "alice", "sasl_password": SECRET}
    assert rest == {"linger": "0.1"}


def test_scram_jaas_line_with_a_shaded_package_and_single_quotes() -> None:
    opts, _ = kafka_properties({"sasl.mechanism": "SCRAM-SHA-512",
                                "sasl.jaas.config": SCRAM_JAAS})
    assert (opts["sasl_mechanism"], opts["sasl_username"], opts["sasl_password"]) == (
        "SCRAM-SHA-512", "bob", SECRET)


def test_jaas_escaped_quote_in_password() -> None:
    family, options = parse_jaas(
        'x.PlainLoginModule required username="a" password="p\\"q";')
    assert (family, options["password"]) == ("PLAIN", 'p"q')


@pytest.mark.parametrize(("props", "match"), [
    ({"sasl.jaas.config": SCRAM_JAAS}, "set sasl.mechanism to SCRAM-SHA-256 or SCRAM-SHA-512"),
    ({"sasl.mechanism": "PLAIN", "sasl.jaas.config": SCRAM_JAAS},
     "ScramLoginModule but sasl.mechanism=PLAIN"),
    ({"sasl.jaas.config": f'x.PlainLoginModule required username="a" password="{SECRET}"'},
     "could not parse the JAAS line"),
    ({"sasl.jaas.config": f'x.PlainLoginModule required password="{SECRET}";'},
     "has no username"),
    ({"sasl.jaas.config": f'a.OAuthBearerLoginModule required secret="{SECRET}";'},
     "OAuthBearerLoginModule is not supported"),
    ({"sasl.jaas.config": PLAIN_JAAS + " " + PLAIN_JAAS}, "more than one login module"),
    ({"ssl.truststore.location": "/x/trust.jks"}, "a JKS truststore cannot be read"),
    ({"ssl.keystore.location": "/x/k.p12", "ssl.keystore.type": "PKCS12"},
     "a PKCS12 keystore cannot be read"),
    ({"ssl.endpoint.identification.algorithm": "ldap"}, "must be https, none or empty"),
])
def test_bad_properties_say_what_is_wrong_without_the_secret(
        props: dict[str, str], match: str) -> None:
    with pytest.raises(ConfigError, match=match) as info:
        kafka_properties(props)
    assert SECRET not in str(info.value)


def test_pem_stores_and_hostname_checking() -> None:
    opts, _ = kafka_properties({
        "ssl.truststore.location": "/ca.pem", "ssl.truststore.type": "pem",
        "ssl.keystore.location": "/client.pem", "ssl.keystore.type": "PEM",
        "ssl.endpoint.identification.algorithm": "",
        "ssl.key.password": SECRET, "client.id": "me",
    })
    assert opts == {"ssl_cafile": "/ca.pem", "ssl_certfile": "/client.pem",
                    "ssl_check_hostname": False, "ssl_password": SECRET, "client_id": "me"}


def test_librdkafka_names() -> None:
    opts, _ = kafka_properties({
        "security.protocol": "SASL_PLAINTEXT", "sasl.mechanisms": "SCRAM-SHA-256",
        "sasl.username": "u", "sasl.password": "123456", "ssl.ca.location": "/ca.pem",
        "ssl.certificate.location": "/c.pem", "ssl.key.location": "/k.pem",
    })
    assert opts == {
        "security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "SCRAM-SHA-256",
        "sasl_username": "u", "sasl_password": "123456",  # text, not the number 123456
        "ssl_cafile": "/ca.pem", "ssl_certfile": "/c.pem", "ssl_keyfile": "/k.pem"}


def test_connection_setup_timeout_in_milliseconds() -> None:
    """Java's and librdkafka's socket.connection.setup.timeout.ms is connect_timeout;
    a bad value is reported as written (milliseconds), not in seconds."""
    opts, rest = kafka_properties({"socket.connection.setup.timeout.ms": "2500"})
    assert (opts, rest) == ({"connect_timeout": 2.5}, {})
    assert ClusterConfig(**opts).connect_timeout == 2.5
    for bad in ("-5", "0", "soon", "inf"):
        with pytest.raises(ConfigError) as info:
            kafka_properties({"socket.connection.setup.timeout.ms": bad})
        assert str(info.value) == (f"invalid socket.connection.setup.timeout.ms={bad!r}: "
                                   "must be a number of milliseconds > 0")
    with pytest.raises(ConfigError, match=r"kafka\.socket\.connection\.setup\.timeout\.ms"):
        kafka_properties({"socket.connection.setup.timeout.ms": "-1"}, prefix="kafka.")


# -- the CLI ------------------------------------------------------------------

def _args(argv: list[str], producer: bool = True) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_bootstrap(parser)
    if producer:
        add_producer_options(parser)
    else:
        from pipeline.cli._common import add_client_options
        add_client_options(parser, what="consumer")
    return parser.parse_args(argv)


def test_config_file_then_x_options_over_it(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PIPELINE_BOOTSTRAP", raising=False)
    ca = str(Pki.create(tmp_path).ca_file)
    props = tmp_path / "client.properties"
    props.write_text(
        "# a comment\n! another\nbootstrap.servers=h1:9093,h2:9093\n"
        "security.protocol = SASL_SSL\nsasl.mechanism: SCRAM-SHA-512\n"
        f"sasl.jaas.config={SCRAM_JAAS.replace('bob', 'carol')}\n"
        f"ssl.ca.location={ca}\n\nlinger=0.05\n"
    )
    args = _args(["--config", str(props), "-X", "sasl.mechanism=SCRAM-SHA-256",
                  "-X", "request_timeout=7"])
    assert resolve_bootstrap(args) == "h1:9093,h2:9093"
    opts = producer_options(args)
    assert opts["security_protocol"] == "SASL_SSL"
    assert opts["sasl_mechanism"] == "SCRAM-SHA-256"  # -X over the file
    assert (opts["sasl_username"], opts["sasl_password"]) == ("carol", SECRET)
    assert (opts["ssl_cafile"], opts["linger"], opts["request_timeout"]) == (
        ca, 0.05, 7)
    # -b wins over bootstrap.servers of the file
    args = _args(["-b", "h3:1", "--config", str(props)])
    assert resolve_bootstrap(args) == "h3:1"
    # a reader takes cluster options only: a producer option is a clear error
    args = _args(["--config", str(props)], producer=False)
    resolve_bootstrap(args)
    with pytest.raises(UserError, match=r"unknown cluster option\(s\) \['linger'\]"):
        cluster_options(args)
    args = _args(["--config", str(props), "-X", "client.id=reader"], producer=False)
    props.write_text(props.read_text().replace("linger=0.05", ""))
    resolve_bootstrap(args)
    cfg = cluster_config(None, cluster_options(args))
    assert (cfg.security_protocol, cfg.sasl_username, cfg.client_id) == (
        "SASL_SSL", "carol", "reader")


def test_config_file_errors_name_the_line_never_its_content(tmp_path: Path) -> None:
    props = tmp_path / "bad.properties"
    props.write_text(f"security.protocol=SSL\n{SECRET}\n")
    with pytest.raises(UserError, match=r"line 2: expected name=value") as info:
        read_properties(str(props))
    assert SECRET not in str(info.value)
    with pytest.raises(UserError, match="cannot read --config"):
        read_properties(str(tmp_path / "missing"))


def test_bad_jaas_from_the_cli_is_a_user_error_without_the_secret() -> None:
    args = _args(["-X", f"sasl.jaas.config=x.PlainLoginModule required password={SECRET}"])
    with pytest.raises(UserError) as info:
        producer_options(args)
    assert "sasl.jaas.config" in str(info.value) and SECRET not in str(info.value)


def test_bad_x_option_never_echoes_a_secret() -> None:
    from pipeline.cli._common import client_option

    with pytest.raises(argparse.ArgumentTypeError) as info:
        client_option(f"sasl.password{SECRET}")
    assert SECRET not in str(info.value)


def test_verbose_echo_of_options_hides_secrets(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="pipeline.cli")
    args = _args(["-X", "security.protocol=SASL_PLAINTEXT", "-X", "sasl.mechanism=PLAIN",
                  "-X", "sasl.username=alice", "-X", f"sasl.password={SECRET}",
                  "-X", "sasl.jaas.config=" + PLAIN_JAAS.replace(SECRET, SECRET + "x")])
    opts = producer_options(args)
    assert opts["sasl_password"] == SECRET + "x"  # the JAAS line wins over sasl.password
    echo = "\n".join(r.getMessage() for r in caplog.records)
    assert "sasl_username='alice'" in echo and "sasl_password='***'" in echo
    assert SECRET not in echo


def test_config_reprs_and_pickles_hide_secrets() -> None:
    cfg = ClusterConfig(security_protocol="SASL_SSL", sasl_mechanism="PLAIN",
                        sasl_username="alice", sasl_password=SECRET, ssl_cafile=None)
    assert SECRET not in repr(cfg) and SECRET not in str(cfg)
    assert pickle.loads(pickle.dumps(cfg)).sasl_password == SECRET  # usable, just not shown


def test_java_producer_properties_in_a_config_file(tmp_path: Path,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    """A producer.properties as the Java client reads it: a producer takes its tuning
    names; a reader warns and ignores them."""
    props = tmp_path / "producer.properties"
    props.write_text("bootstrap.servers=h:1\nacks=1\nlinger.ms=25\ncompression.type=zstd\n"
                     "enable.idempotence=false\nclient.id=me\n")
    opts = producer_options(_args(["--config", str(props)]))
    assert (opts["acks"], opts["linger"], opts["compression"], opts["idempotent"],
            opts["client_id"]) == (1, 0.025, "zstd", False, "me")
    args = _args(["--config", str(props)], producer=False)
    caplog.set_level(logging.WARNING, logger="pipeline.cli")
    assert cluster_options(args) == {"client_id": "me"}
    assert "linger.ms is a producer property: ignored here" in caplog.text
    with pytest.raises(UserError, match=r"linger\.ms='soon': not a valid value"):
        producer_options(_args(["-X", "linger.ms=soon"]))


def test_cli_error_hints_use_the_property_names() -> None:
    from pipeline.cli._common import cli_names

    assert cli_names(
        "not trusted; pass ssl_cafile with the CA; or set ssl_check_hostname=False; "
        "check security_protocol and sasl_mechanism"
    ) == ("not trusted; pass ssl.ca.location with the CA; or set "
          "ssl.endpoint.identification.algorithm=none; check security.protocol and "
          "sasl.mechanism")
