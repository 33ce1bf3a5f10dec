"""Sans-I/O Kafka protocol: primitives, generated messages, headers, codec, framing.

Bytes in, frozen dataclasses out, and back. Nothing in this package imports trio,
socket, time, asyncio or threading, nor any other ``pipeline`` package (not even
``util``, whose group rule needs trio): ``tests/protocol/test_sans_io.py`` and
``tests/test_layers.py`` hold it. The modules:

* ``primitives`` (``Writer``, ``Reader``), ``errors`` (``ErrorCode``, the exceptions),
  ``api`` (``ApiKey``, the versions we speak), ``base`` (what every message class is),
  ``messages/`` (one generated module per API), ``versions`` (negotiation), ``header``,
  ``codec`` (whole frames), ``framing`` (splitting a byte stream into frames);
* ``records`` (RecordBatch v2: ``Record``, ``RecordBatch``, ``BatchBuilder``,
  ``restamp_batch``, ``batch_size_for_record``; layout in ``batch_format``, decoder in
  ``batch_decoder``), ``compression``, ``crc``;
* ``columnar`` (many rows as flat buffers, encoded by the C kernel ``_kernel.c`` or its
  twin ``_kernel_py.py``; input normalisation in ``_columnar_input``);
* ``sasl`` (the SASL mechanisms as state machines).
"""

from __future__ import annotations
