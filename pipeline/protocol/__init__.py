"""Sans-I/O Kafka protocol: primitives, generated messages, headers, codec, framing."""

from __future__ import annotations
