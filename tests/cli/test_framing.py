"""The CLI's byte handling without a broker: kcat's escapes, input split at any
delimiter whatever the read sizes, length-prefixed frames, and kcat's format tokens."""

from __future__ import annotations

import argparse
import io
from types import SimpleNamespace

import pytest

from pipeline.cli._common import UserError, unescape
from pipeline.cli.consume import _offset, format_record, record_json
from pipeline.cli.produce import length_prefixed, split_messages


@pytest.mark.parametrize(("text", "expected"), [
    ("\\n", b"\n"), ("\\t\\n\\n", b"\t\n\n"), ("\\x54!\\x45\\x53T", b"T!EST"),
    ("\\x00", b"\x00"), ("\\xff", b"\xff"), ("a\\\\b", b"a\\b"), ("\\xZZ", b"\\xZZ"),
    ("|", b"|"), ("é", "é".encode()), ("", b""),
])
def test_kcat_escapes(text: str, expected: bytes) -> None:
    assert unescape(text) == expected


@pytest.mark.parametrize("chunk", [1, 2, 3, 7, 1 << 16])
@pytest.mark.parametrize("delim", [b"\n", b"\x00", b"--", b"\r\n"])
def test_split_at_any_delimiter_across_reads(chunk: int, delim: bytes) -> None:
    messages = [b"a", b"", b"bc" * 5, bytes(b for b in range(256) if bytes([b]) not in delim)]
    data = delim.join(messages) + delim
    assert list(split_messages(io.BytesIO(data), delim, chunk=chunk)) == messages
    # no delimiter after the last message: it still counts
    assert list(split_messages(io.BytesIO(data[: -len(delim)]), delim, chunk=chunk)) == messages


def test_length_prefixed_frames() -> None:
    data = (b"\x00\x00\x00\x03abc" + b"\xff\xff\xff\xff" + b"\x00\x00\x00\x00"
            + b"\x00\x00\x00\x01\n")
    assert list(length_prefixed(io.BytesIO(data))) == [b"abc", None, b"", b"\n"]
    with pytest.raises(UserError, match="ends inside the length of message 2"):
        list(length_prefixed(io.BytesIO(b"\x00\x00\x00\x00\x00\x00")))
    with pytest.raises(UserError, match="message 1 has length -2"):
        list(length_prefixed(io.BytesIO(b"\xff\xff\xff\xfe")))


def _record(**over: object) -> SimpleNamespace:
    fields: dict[str, object] = dict(topic="t", partition=2, offset=7, timestamp=1234,
                                     key=b"k", value=b"v\x00", headers=(("h", b"1"),))
    fields.update(over)
    return SimpleNamespace(**fields)


def test_format_tokens() -> None:
    rec = _record()
    assert format_record(rec, "%t/%p/%o/%T %k=%s %h %K %S%%\\n") == (
        b"t/2/7/1234 k=v\x00 h=1 1 2%\n")
    assert format_record(rec, "%R%s") == b"\x00\x00\x00\x02v\x00"
    assert format_record(_record(value=None, key=None), "%R|%k|%s|%K|%S") == (
        b"\xff\xff\xff\xff|||-1|-1")
    assert format_record(_record(value=None), "%s", null=True) == b"NULL"


def test_json_envelope_is_kcats() -> None:
    assert record_json(_record(headers=(("a", b"1"), ("b", None)))) == (
        '{"topic": "t", "partition": 2, "offset": 7, "ts": 1234, "headers": ["a", "1", "b", '
        'null], "key": "k", "payload": "v\\u0000"}')


@pytest.mark.parametrize(("text", "parsed"), [
    ("beginning", ("start", "beginning")), ("end", ("start", "end")), ("5", ("start", 5)),
    ("-3", ("start", -3)), ("s@1700000000000", ("start_ts", 1700000000000)),
    ("e@0", ("stop_ts", 0)),
])
def test_offsets(text: str, parsed: tuple[str, object]) -> None:
    assert _offset(text) == parsed


@pytest.mark.parametrize("text", ["s@", "s@-1", "e@soon", "sometime"])
def test_bad_offsets(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        _offset(text)
