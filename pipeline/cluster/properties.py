"""Client properties as users already write them (Java client, librdkafka, kcat, Spark's
``kafka.*`` options) -> :class:`~pipeline.cluster.config.ClusterConfig` options.

Used by the CLI (``-X name=value``, ``--config FILE``) and the Spark data source
(``kafka.<property>``)::

    security.protocol=SASL_SSL                      -> security_protocol
    sasl.mechanism (Java) / sasl.mechanisms (librdkafka) -> sasl_mechanism
    sasl.username / sasl.password (librdkafka)      -> sasl_username / sasl_password
    sasl.jaas.config (Java)                         -> sasl_username / sasl_password, from a
        PlainLoginModule or ScramLoginModule line (any package prefix, e.g. Databricks'
        shaded ``kafkashaded.org.apache...``); other login modules are refused
    ssl.ca.location (librdkafka)                    -> ssl_cafile
    ssl.truststore.location + ssl.truststore.type=PEM (Java) -> ssl_cafile
    ssl.certificate.location / ssl.key.location / ssl.key.password -> ssl_certfile / ssl_keyfile
        / ssl_password
    ssl.keystore.location + ssl.keystore.type=PEM (key and chain in one file) -> ssl_certfile
    ssl.endpoint.identification.algorithm=https|""|none -> ssl_check_hostname
    client.id                                       -> client_id
    socket.connection.setup.timeout.ms (Java, librdkafka) -> connect_timeout (seconds)

JKS and PKCS#12 stores cannot be read by Python's ``ssl``: they are refused with how to
convert them. Errors name the property, never a secret value (a JAAS line holds the
password: a parse error says what is wrong with it, not what it contains).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from pipeline.cluster.config import parse_option_value
from pipeline.cluster.errors import ConfigError

__all__ = ["PROPERTY_NAMES", "kafka_properties", "option_from_text", "parse_jaas"]

_DIRECT = {
    "security.protocol": "security_protocol",
    "sasl.mechanism": "sasl_mechanism",
    "sasl.mechanisms": "sasl_mechanism",
    "sasl.username": "sasl_username",
    "sasl.password": "sasl_password",
    "ssl.ca.location": "ssl_cafile",
    "ssl.certificate.location": "ssl_certfile",
    "ssl.key.location": "ssl_keyfile",
    "ssl.key.password": "ssl_password",
    "client.id": "client_id",
}
_STORES = ("ssl.truststore.location", "ssl.truststore.type", "ssl.keystore.location",
           "ssl.keystore.type")
#: Durations in milliseconds -> options in seconds (checked here, in the user's units).
_MILLIS = {"socket.connection.setup.timeout.ms": "connect_timeout"}
#: Every property name :func:`kafka_properties` understands.
PROPERTY_NAMES = frozenset({*_DIRECT, *_STORES, *_MILLIS, "sasl.jaas.config",
                            "ssl.endpoint.identification.algorithm"})


def _seconds(prefix: str, name: str, value: str) -> float:
    """A positive number of milliseconds as seconds; errors say what the user wrote."""
    try:
        millis = float(value.strip())
    except ValueError:
        millis = math.nan
    if not millis > 0 or math.isinf(millis):
        raise ConfigError(f"invalid {prefix}{name}={value!r}: must be a number of "
                          "milliseconds > 0")
    return millis / 1000

_MODULES = {"PlainLoginModule": "PLAIN", "ScramLoginModule": "SCRAM"}
_FLAGS = ("required", "requisite", "sufficient", "optional")


def option_from_text(name: str, text: str, cls: type[Any]) -> Any:
    """A ``cls`` (config dataclass) field given as text: kept as text for a string
    field (a password "123456" stays a string), else :func:`parse_option_value`."""
    for f in cls.option_fields():
        if f.name == name:
            kind = str(f.type)
            if kind.startswith("str") and "float" not in kind and "int" not in kind:
                return text
            break
    return parse_option_value(text)


def _jaas_tokens(text: str, where: str) -> list[str]:
    bad = ConfigError(
        f"{where}: could not parse the JAAS line (expected '<package>.PlainLoginModule "
        'required username="..." password="...";\' or the ScramLoginModule equivalent)'
    )
    tokens: list[str] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch.isspace():
            i += 1
        elif ch in "=;":
            tokens.append(ch)
            i += 1
        elif ch in "\"'":
            j, out = i + 1, []
            while j < n and text[j] != ch:
                if text[j] == "\\" and j + 1 < n:
                    j += 1
                out.append(text[j])
                j += 1
            if j >= n:
                raise bad
            tokens.append("\0" + "".join(out))  # \0 marks a quoted value
            i = j + 1
        else:
            j = i
            while j < n and not text[j].isspace() and text[j] not in "=;\"'":
                j += 1
            tokens.append(text[i:j])
            i = j
    return tokens


def parse_jaas(text: str, *, where: str = "sasl.jaas.config") -> tuple[str, dict[str, str]]:
    """``(family, options)`` of one PlainLoginModule / ScramLoginModule JAAS line; family
    is ``"PLAIN"`` or ``"SCRAM"``. Raises :class:`ConfigError` (never quoting the line)."""
    tokens = _jaas_tokens(text, where)
    bad = ConfigError(f"{where}: could not parse the JAAS line (expected one login module: "
                      '<class> required username="..." password="...";)')
    if len(tokens) < 2 or tokens[-1] != ";" or tokens[1].lower() not in _FLAGS:
        raise bad
    module = tokens[0].rsplit(".", 1)[-1]
    if module not in _MODULES:
        raise ConfigError(
            f"{where}: login module {module} is not supported; supported: PlainLoginModule, "
            "ScramLoginModule (OAUTHBEARER: pass sasl_oauth_token_provider in Python)"
        )
    options: dict[str, str] = {}
    body = tokens[2:-1]
    if len(body) % 3 or ";" in body:
        raise bad if ";" not in body else ConfigError(
            f"{where}: holds more than one login module; give exactly one")
    for k in range(0, len(body), 3):
        key, eq, value = body[k:k + 3]
        if eq != "=" or key.startswith("\0") or key in "=;":
            raise bad
        options[key] = value[1:] if value.startswith("\0") else value
    missing = [key for key in ("username", "password") if not options.get(key)]
    if missing:
        raise ConfigError(f"{where}: the {module} line has no {' or '.join(missing)}")
    return _MODULES[module], options


def kafka_properties(properties: Mapping[str, str], *, prefix: str = ""
                     ) -> tuple[dict[str, Any], dict[str, str]]:
    """Split ``properties`` into ClusterConfig options (from the names above) and the
    rest (returned untouched, for the caller's own names). ``prefix`` is how the
    caller's user wrote the names (``"kafka."`` for Spark) for error texts."""
    options: dict[str, Any] = {}
    rest: dict[str, str] = {}
    props = {k.strip(): v for k, v in properties.items()}
    for name, value in props.items():
        key = name.lower()
        if key in _DIRECT:
            options[_DIRECT[key]] = value
        elif key in _MILLIS:
            options[_MILLIS[key]] = _seconds(prefix, name, value)
        elif key == "ssl.endpoint.identification.algorithm":
            if value.strip().lower() not in ("https", "", "none"):
                raise ConfigError(f"{prefix}{name}={value!r}: must be https, none or empty")
            options["ssl_check_hostname"] = value.strip().lower() == "https"
        elif key not in PROPERTY_NAMES:
            rest[name] = value
    lower = {k.lower(): v for k, v in props.items()}
    for kind, field in (("truststore", "ssl_cafile"), ("keystore", "ssl_certfile")):
        location = lower.get(f"ssl.{kind}.location")
        store_type = lower.get(f"ssl.{kind}.type", "JKS" if location else "").upper()
        if location is None:
            continue
        if store_type != "PEM":
            raise ConfigError(
                f"{prefix}ssl.{kind}.location: a {store_type} {kind} cannot be read by "
                f"Python's ssl; convert it to PEM (keytool -exportcert -rfc / openssl pkcs12) "
                f"and set {prefix}ssl.{kind}.type=PEM, or use {prefix}ssl.ca.location / "
                f"ssl.certificate.location"
            )
        options[field] = location
    jaas = lower.get("sasl.jaas.config")
    if jaas is not None:
        family, module_options = parse_jaas(jaas, where=f"{prefix}sasl.jaas.config")
        mechanism = str(options.get("sasl_mechanism") or "").upper()
        if not mechanism and family == "PLAIN":
            options["sasl_mechanism"] = mechanism = "PLAIN"
        if not mechanism:
            raise ConfigError(f"{prefix}sasl.jaas.config has a ScramLoginModule: set "
                              f"{prefix}sasl.mechanism to SCRAM-SHA-256 or SCRAM-SHA-512")
        if not mechanism.startswith(family):
            raise ConfigError(
                f"{prefix}sasl.jaas.config has a {family.title()}LoginModule but "
                f"{prefix}sasl.mechanism={mechanism}"
            )
        options["sasl_username"] = module_options["username"]
        options["sasl_password"] = module_options["password"]
    return options, rest
