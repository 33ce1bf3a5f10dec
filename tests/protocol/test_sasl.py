"""SASL client state machines, replayed against the RFCs' own example exchanges."""

from __future__ import annotations

import base64
import hashlib
import hmac

import pytest

from pipeline.protocol.sasl import (
    OAuthBearerClient,
    PlainClient,
    SaslError,
    ScramClient,
    scram_keys,
    scram_saslname,
)

# RFC 5802 section 5 (SCRAM-SHA-1), user "user", password "pencil".
RFC5802 = (
    "SCRAM-SHA-1",
    "fyko+d2lbbFgONRv9qkxdawL",
    b"n,,n=user,r=fyko+d2lbbFgONRv9qkxdawL",
    b"r=fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j,s=QSXCR+Q6sek8bf92,i=4096",
    b"c=biws,r=fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j,p=v0X8v3Bz2T0CJGbJQyF0X+HI4Ts=",
    b"v=rmF9pqV8S7suAoZWja4dJRkFsKQ=",
)
# RFC 7677 section 3 (SCRAM-SHA-256), same user and password.
RFC7677 = (
    "SCRAM-SHA-256",
    "rOprNGfwEbeRWgbNEkqO",
    b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO",
    b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096",
    b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
    b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=",
    b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=",
)


@pytest.mark.parametrize("vector", [RFC5802, RFC7677], ids=["rfc5802-sha1", "rfc7677-sha256"])
def test_scram_replays_the_rfc_example_exchange(vector: tuple[str, str, bytes, bytes, bytes, bytes]
                                                ) -> None:
    mechanism, nonce, client_first, server_first, client_final, server_final = vector
    client = ScramClient(mechanism, "user", "pencil", nonce=nonce)
    assert client.start() == client_first
    assert client.step(server_first) == client_final
    assert not client.complete
    assert client.step(server_final) is None
    assert client.complete


@pytest.mark.parametrize("vector", [RFC5802, RFC7677], ids=["rfc5802-sha1", "rfc7677-sha256"])
def test_scram_refuses_a_wrong_server_signature(vector: tuple[str, str, bytes, bytes, bytes, bytes]
                                                ) -> None:
    mechanism, nonce, _, server_first, _, server_final = vector
    client = ScramClient(mechanism, "user", "pencil", nonce=nonce)
    client.start()
    client.step(server_first)
    forged = b"v=" + base64.b64encode(b"\x00" * len(base64.b64decode(server_final[2:])))
    with pytest.raises(SaslError, match="signature is wrong") as info:
        client.step(forged)
    assert "pencil" not in str(info.value)
    assert not client.complete


def test_scram_sha512_matches_a_direct_computation() -> None:
    """No RFC publishes a SHA-512 exchange: check the proof against the RFC 5802
    formulas computed here (and against Kafka itself in tests/apache_kafka)."""
    client = ScramClient("SCRAM-SHA-512", "al=i,ce", "s3cr3t", nonce="abc")
    first = client.start()
    assert first == b"n,,n=al=3Di=2Cce,r=abc"
    salt = b"0123456789abcdef"
    server_first = b"r=abcXYZ,s=" + base64.b64encode(salt) + b",i=4096"
    final = client.step(server_first)
    assert final is not None
    without_proof, _, proof_b64 = final.rpartition(b",p=")
    assert without_proof == b"c=biws,r=abcXYZ"
    salted = hashlib.pbkdf2_hmac("sha512", b"s3cr3t", salt, 4096)
    client_key = hmac.new(salted, b"Client Key", "sha512").digest()
    stored = hashlib.sha512(client_key).digest()
    auth = first[3:] + b"," + server_first + b"," + without_proof
    signature = hmac.new(stored, auth, "sha512").digest()
    assert base64.b64decode(proof_b64) == bytes(a ^ b for a, b in zip(client_key, signature,
                                                                      strict=True))
    server_key = hmac.new(salted, b"Server Key", "sha512").digest()
    assert scram_keys("sha512", b"s3cr3t", salt, 4096) == (client_key, stored, server_key)
    client.step(b"v=" + base64.b64encode(hmac.new(server_key, auth, "sha512").digest()))
    assert client.complete


@pytest.mark.parametrize(
    ("server_first", "match"),
    [
        (b"r=OTHERnonce,s=QSXCR+Q6sek8bf92,i=4096", "does not extend"),
        (b"r=abc,s=QSXCR+Q6sek8bf92,i=4096", "does not extend"),  # nothing added by the server
        (b"r=abcdef,s=QSXCR+Q6sek8bf92,i=1000", "at least 4096"),
        (b"r=abcdef,s=QSXCR+Q6sek8bf92", "lacks"),
        (b"r=abcdef,s=***,i=4096", "bad salt"),
        (b"e=unknown-user", "refused the SCRAM exchange: unknown-user"),
        (b"m=ext,r=abcdef,s=QSXCR+Q6sek8bf92,i=4096", "extension"),
        (b"garbage", "malformed"),
        (b"\xff\xfe", "not UTF-8"),
    ],
)
def test_scram_refuses_bad_server_first_messages(server_first: bytes, match: str) -> None:
    client = ScramClient("SCRAM-SHA-256", "user", "hunter2", nonce="abc")
    client.start()
    with pytest.raises(SaslError, match=match) as info:
        client.step(server_first)
    assert "hunter2" not in str(info.value)


def test_scram_server_error_in_final_message() -> None:
    _, nonce, _, server_first, _, _ = RFC7677
    client = ScramClient("SCRAM-SHA-256", "user", "pencil", nonce=nonce)
    client.start()
    client.step(server_first)
    with pytest.raises(SaslError, match="refused the SCRAM proof: invalid-proof"):
        client.step(b"e=invalid-proof")


def test_scram_state_machine_refuses_out_of_order_steps() -> None:
    client = ScramClient("SCRAM-SHA-256", "user", "pencil", nonce="abc")
    with pytest.raises(SaslError):
        client.step(b"r=abcd,s=QSXCR+Q6sek8bf92,i=4096")
    client.start()
    with pytest.raises(SaslError, match="already started"):
        client.start()


@pytest.mark.parametrize("nonce", ["", "a,b", "é", "a\x00"])
def test_scram_refuses_bad_nonces(nonce: str) -> None:
    with pytest.raises(SaslError, match="nonce"):
        ScramClient("SCRAM-SHA-256", "user", "pencil", nonce=nonce)


def test_scram_unknown_mechanism() -> None:
    with pytest.raises(SaslError, match="not a SCRAM mechanism"):
        ScramClient("SCRAM-MD5", "user", "pencil", nonce="abc")


def test_saslname_escaping() -> None:
    assert scram_saslname("a=b,c") == "a=3Db=2Cc"
    assert scram_saslname("plain") == "plain"


def test_plain_is_one_message_and_an_empty_answer() -> None:
    client = PlainClient("alice", "s3cr3t")
    assert client.start() == b"\x00alice\x00s3cr3t"
    assert client.step(b"") is None
    assert client.complete
    with pytest.raises(SaslError, match="already started"):
        client.start()  # the message (and so the password) is not kept


def test_plain_refuses_nul_and_unexpected_challenges() -> None:
    with pytest.raises(SaslError, match="NUL"):
        PlainClient("al\x00ice", "x")
    client = PlainClient("alice", "s3cr3t")
    client.start()
    with pytest.raises(SaslError, match="unexpected bytes"):
        client.step(b"?")


def test_oauthbearer_initial_response_is_rfc7628() -> None:
    client = OAuthBearerClient("eyJhbGciOiJub25lIn0.eyJzdWIiOiJhIn0.")
    assert client.start() == b"n,,\x01auth=Bearer eyJhbGciOiJub25lIn0.eyJzdWIiOiJhIn0.\x01\x01"
    assert client.step(b"") is None
    assert client.complete


def test_oauthbearer_error_challenge_is_acknowledged() -> None:
    client = OAuthBearerClient("tok")
    client.start()
    assert client.step(b'{"status":"invalid_token"}') == b"\x01"
    assert client.server_error == "invalid_token"
    assert not client.complete
    with pytest.raises(SaslError):
        client.step(b"")


@pytest.mark.parametrize("token", ["", "a b", "a\x01b", "tök"])
def test_oauthbearer_refuses_tokens_that_would_break_the_message(token: str) -> None:
    with pytest.raises(SaslError):
        OAuthBearerClient(token)


def test_reprs_hold_no_secrets() -> None:
    clients = [PlainClient("alice", "pw-123"), ScramClient("SCRAM-SHA-512", "alice", "pw-123",
               nonce="n"), OAuthBearerClient("tok-123")]
    for client in clients:
        assert "pw-123" not in repr(client) and "tok-123" not in repr(client)
