"""The security options of ClusterConfig: checked once, with errors that say what to do,
and secrets that never show in a repr or an error text."""

from __future__ import annotations

import dataclasses
import os
import pickle
import ssl
from pathlib import Path
from typing import Any

import pytest

from pipeline.cluster.config import ClusterConfig
from pipeline.cluster.errors import ConfigError
from pipeline.cluster.security import SECRET_OPTIONS, redact_options
from pipeline.producer._config import ProducerConfig, make_config

trustme = pytest.importorskip("trustme")
serialization = pytest.importorskip("cryptography.hazmat.primitives.serialization")

SECRET = "pa55-W0RD-do-not-show"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A CA file, a client certificate, its key plain and encrypted (password SECRET)."""
    root = tmp_path_factory.mktemp("pki")
    ca = trustme.CA()
    leaf = ca.issue_cert("client@example")
    paths = {name: str(root / name) for name in ("ca.pem", "cert.pem", "key.pem",
                                                 "key-enc.pem", "other-key.pem", "junk.pem")}
    ca.cert_pem.write_to_path(paths["ca.pem"])
    leaf.cert_chain_pems[0].write_to_path(paths["cert.pem"])
    leaf.private_key_pem.write_to_path(paths["key.pem"])
    key = serialization.load_pem_private_key(leaf.private_key_pem.bytes(), password=None)
    Path(paths["key-enc.pem"]).write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(SECRET.encode())))
    trustme.CA().issue_cert("x").private_key_pem.write_to_path(paths["other-key.pem"])
    Path(paths["junk.pem"]).write_text("not a certificate\n")
    return paths


SASL = dict(security_protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-512",
            sasl_username="alice", sasl_password=SECRET)

BAD: list[tuple[dict[str, Any], str]] = [
    (dict(security_protocol="TLS"), r"invalid security_protocol='TLS': must be one of PLAINTEXT"),
    (dict(security_protocol="SASL_SSL"), r"SASL_SSL needs sasl_mechanism: one of PLAIN, SCRAM"),
    (dict(security_protocol="SASL_PLAINTEXT", sasl_mechanism="GSSAPI"),
     r"GSSAPI \(Kerberos\) is not supported"),
    (dict(security_protocol="SASL_PLAINTEXT", sasl_mechanism="SCRAM-SHA-1"),
     r"invalid sasl_mechanism='SCRAM-SHA-1'"),
    (dict(security_protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN", sasl_username="alice"),
     r"sasl_mechanism=PLAIN needs sasl_password"),
    (dict(security_protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN", sasl_password=SECRET),
     r"needs sasl_username"),
    (dict(security_protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN", sasl_username="",
          sasl_password=SECRET), r"invalid sasl_username='': must be a non-empty string"),
    (dict(security_protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN", sasl_username="a",
          sasl_password=12345), r"invalid sasl_password=\(hidden\)"),
    (dict(security_protocol="SASL_PLAINTEXT", sasl_mechanism="OAUTHBEARER"),
     r"OAUTHBEARER needs sasl_oauth_token_provider"),
    (dict(security_protocol="SASL_PLAINTEXT", sasl_mechanism="OAUTHBEARER",
          sasl_oauth_token_provider="tok"), r"sasl_oauth_token_provider=\(hidden\): must be a"),
    (dict(security_protocol="SASL_PLAINTEXT", sasl_mechanism="OAUTHBEARER",
          sasl_oauth_token_provider=lambda: ("t", 0), sasl_password=SECRET),
     r"sasl_password are not used by OAUTHBEARER"),
    (dict(security_protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN", sasl_username="a",
          sasl_password=SECRET, sasl_oauth_token_provider=lambda: ("t", 0)),
     r"only used with sasl_mechanism=OAUTHBEARER"),
    (dict(sasl_mechanism="PLAIN", sasl_username="a", sasl_password=SECRET),
     r"sasl_mechanism, sasl_username, sasl_password set but security_protocol=PLAINTEXT"),
    (dict(security_protocol="SSL", sasl_username="a"), r"SASL options need security_protocol"),
    (dict(ssl_check_hostname=False, ssl_password=SECRET),
     r"ssl_password set but security_protocol=PLAINTEXT: TLS options need"),
    (dict(security_protocol="SSL", ssl_check_hostname="no"),
     r"invalid ssl_check_hostname='no'"),
    (dict(security_protocol="SSL", ssl_cafile="/no/such/ca.pem"),
     r"invalid ssl_cafile='/no/such/ca.pem': no such file"),
    (dict(security_protocol="SSL", ssl_context="ctx"), r"must be an ssl.SSLContext"),
]


@pytest.mark.parametrize(("options", "match"), BAD, ids=lambda x: str(x)[:40])
def test_invalid_security_options_are_named(options: dict[str, Any], match: str) -> None:
    for cls in (ClusterConfig, ProducerConfig):
        with pytest.raises(ConfigError, match=match) as info:
            cls(**options)
        assert SECRET not in str(info.value)


def test_file_problems(pki: dict[str, str], tmp_path: Path) -> None:
    ssl_opts = dict(security_protocol="SSL")
    cases: list[tuple[dict[str, Any], str]] = [
        (dict(ssl_cafile=pki["junk.pem"]), r"no PEM certificate could be read"),
        (dict(ssl_keyfile=pki["key.pem"]), r"ssl_keyfile needs ssl_certfile"),
        (dict(ssl_password=SECRET), r"no key was given"),
        (dict(ssl_certfile=pki["cert.pem"], ssl_keyfile=pki["key-enc.pem"]),
         r"is encrypted: pass ssl_password"),
        (dict(ssl_certfile=pki["cert.pem"], ssl_keyfile=pki["key-enc.pem"],
              ssl_password="wrong"), r"could not be loaded"),
        (dict(ssl_certfile=pki["cert.pem"], ssl_keyfile=pki["other-key.pem"]),
         r"the key must belong to the certificate"),
        (dict(ssl_certfile=pki["cert.pem"], ssl_keyfile=pki["key.pem"],
              ssl_context=ssl.create_default_context()), r"either ssl_context or ssl_certfile"),
    ]
    unreadable = tmp_path / "locked.pem"
    unreadable.write_text("x")
    unreadable.chmod(0)
    if not os.access(unreadable, os.R_OK):  # root reads anything
        cases.append((dict(ssl_cafile=str(unreadable)), r"not readable"))
    for options, match in cases:
        with pytest.raises(ConfigError, match=match) as info:
            ClusterConfig(**ssl_opts, **options)
        assert SECRET not in str(info.value)


def test_valid_tls_configs_build_their_context(pki: dict[str, str]) -> None:
    plain = ClusterConfig(security_protocol="ssl", ssl_cafile=pki["ca.pem"],
                          ssl_certfile=pki["cert.pem"], ssl_keyfile=pki["key.pem"])
    assert plain.security_protocol == "SSL"
    encrypted = ClusterConfig(security_protocol="SASL_SSL", sasl_mechanism="plain",
                              sasl_username="a", sasl_password=SECRET,
                              ssl_cafile=pki["ca.pem"], ssl_certfile=pki["cert.pem"],
                              ssl_keyfile=pki["key-enc.pem"], ssl_password=SECRET,
                              ssl_check_hostname=False)
    assert encrypted.sasl_mechanism == "PLAIN"
    assert encrypted._tls is not None and not encrypted._tls.check_hostname
    assert plain._tls is not None and plain._tls.check_hostname
    assert plain._tls.verify_mode == ssl.CERT_REQUIRED
    ready = ssl.create_default_context()
    assert ClusterConfig(security_protocol="SSL", ssl_context=ready)._tls is ready
    assert ClusterConfig()._tls is None


def test_an_injected_connector_owns_the_transport(pki: dict[str, str]) -> None:
    async def connector(host: str, port: int) -> Any:
        raise AssertionError  # pragma: no cover

    with pytest.raises(ConfigError, match="cannot be used with a custom connector"):
        ClusterConfig(security_protocol="SSL", ssl_cafile=pki["ca.pem"], connector=connector)
    cfg = ClusterConfig(security_protocol="SASL_SSL", sasl_mechanism="PLAIN", sasl_username="a",
                        sasl_password=SECRET, connector=connector)
    assert cfg.make_connector() is connector


def test_secrets_never_in_reprs(pki: dict[str, str]) -> None:
    def provider() -> tuple[str, float]:  # pragma: no cover
        return (SECRET, 0.0)

    configs: list[Any] = [
        ClusterConfig(**SASL),
        ProducerConfig(**SASL, ssl_cafile=pki["ca.pem"], ssl_certfile=pki["cert.pem"],
                       ssl_keyfile=pki["key-enc.pem"], ssl_password=SECRET),
        make_config(None, dict(SASL)).cluster,
        ClusterConfig(security_protocol="SASL_PLAINTEXT", sasl_mechanism="OAUTHBEARER",
                      sasl_oauth_token_provider=provider),
    ]
    for cfg in configs:
        assert SECRET not in repr(cfg) and SECRET not in str(cfg)
        assert "sasl_mechanism=" in repr(cfg)
    # The secret is really there (and survives replace / the cluster part / pickling).
    assert dataclasses.replace(configs[1], linger=0.5).cluster.sasl_password == SECRET
    assert configs[1].cluster.ssl_password == SECRET
    assert pickle.loads(pickle.dumps(configs[0])).sasl_password == SECRET
    copy = pickle.loads(pickle.dumps(configs[1]))  # the TLS context is rebuilt, not pickled
    assert type(copy) is ProducerConfig and copy == configs[1]
    assert copy.cluster._tls is not None and copy.cluster._tls is not configs[1].cluster._tls
    assert redact_options({"sasl_password": SECRET, "linger": 1, "ssl_password": None}) == {
        "sasl_password": "***", "linger": 1, "ssl_password": None}
    assert {"sasl_password", "ssl_password", "sasl_oauth_token_provider"} <= SECRET_OPTIONS


def test_unknown_option_lists_the_security_names() -> None:
    with pytest.raises(ConfigError, match="sasl_mechanism") as info:
        make_config(None, {"sasl_mechanisms": "PLAIN"})
    assert "unknown" in str(info.value)
