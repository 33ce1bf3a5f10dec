"""Pure-Python twin of the C kernel ``pipeline.protocol._kernel`` (the codec half).

Same functions, same arguments, same results and same errors as ``_kernel.c``
(tests run both on the same inputs and compare): it is what ``columnar.py``
uses when the extension could not be built (no compiler at install time) or
when ``PIPELINE_PURE_PYTHON=1`` is set. It loops per row, so it is slower; it
still builds no ``Record`` object per row. The spec tuples it reads are
described at the top of ``_kernel.c``.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Sequence
from itertools import accumulate
from typing import Any, Final

from pipeline.protocol.records import _ZZ, _zigzag_varint
from pipeline.protocol.records import _varint_size as _vz_size

_TABLE: Final = len(_ZZ)
_HEADER: Final = 61  # BATCH_HEADER_SIZE
_OVERHEAD: Final = 21  # records._MAX_RECORD_OVERHEAD
_NULL: Final = b"\x01"  # zigzag(-1)
_ZERO: Final = b"\x00"
_INT64_MAX: Final = (1 << 63) - 1
_INT32_MAX: Final = (1 << 31) - 1


class _Bad(Exception):
    """An invalid cell found while walking the columns (mapped to ValueError)."""


def _vz(n: int) -> bytes:
    return _ZZ[n] if 0 <= n < _TABLE else _zigzag_varint(n)


def _ints(obj: Any, wide: bool) -> memoryview:
    return memoryview(obj).cast("B").cast("q" if wide else "i")


class _Bin:
    """One binary column of a spec: cells are memoryview slices of its data."""

    __slots__ = ("data", "n", "name", "off", "valid", "voff")

    def __init__(self, spec: tuple[Any, ...], name: str) -> None:
        off, wide, data, valid, voff, n = spec
        self.name = name
        if n < 0 or voff < 0:
            raise ValueError(f"{name}: negative length or bit offset")
        self.n = n
        self.voff = voff
        offsets = _ints(off, wide)
        if len(offsets) < n + 1:
            raise ValueError(f"{name}: offsets buffer holds fewer than {n + 1} entries")
        self.off = offsets
        self.data = memoryview(data).cast("B")
        self.valid = None
        if valid is not None:
            bits = memoryview(valid).cast("B")
            if len(bits) < (voff + n + 7) // 8:
                raise ValueError(f"{name}: validity bitmap too short for {n} rows")
            self.valid = bits

    def cell(self, row: int) -> memoryview | None:
        valid = self.valid
        if valid is not None:
            k = self.voff + row
            if not (valid[k >> 3] >> (k & 7)) & 1:
                return None
        a = self.off[row]
        b = self.off[row + 1]
        if a < 0 or b < a or b > len(self.data):
            raise _Bad
        return self.data[a:b]


class _Cols:
    """A parsed columns spec, with the per-row payload encoder."""

    __slots__ = ("default_ts", "hkeys", "hoff", "hvalid", "hvalues", "hvoff", "keys", "n",
                 "ts", "values")

    def __init__(self, spec: tuple[Any, ...]) -> None:
        n, vspec, kspec, hspec, ts, default_ts = spec
        self.n = n
        self.default_ts = default_ts
        self.values = _Bin(vspec, "values")
        self.keys = None if kspec is None else _Bin(kspec, "keys")
        self.hoff: memoryview | None = None
        self.hvalid: memoryview | None = None
        self.hvoff = 0
        self.hkeys: _Bin | None = None
        self.hvalues: _Bin | None = None
        if hspec is not None:
            off, wide, valid, voff, hn, hk, hv = hspec
            if hn < 0 or voff < 0:
                raise ValueError("headers: negative length or bit offset")
            self.hoff = _ints(off, wide)
            if len(self.hoff) < hn + 1:
                raise ValueError("headers: offsets buffer too short")
            if valid is not None:
                self.hvalid = memoryview(valid).cast("B")
                if len(self.hvalid) < (voff + hn + 7) // 8:
                    raise ValueError("headers: validity bitmap too short")
            self.hvoff = voff
            self.hkeys = _Bin(hk, "header keys")
            self.hvalues = _Bin(hv, "header values")
            if self.hkeys.n != self.hvalues.n:
                raise ValueError("headers: key and value entry counts differ")
            if hn != n:
                raise ValueError("columns spec: column lengths differ")
        if self.values.n != n or (self.keys is not None and self.keys.n != n):
            raise ValueError("columns spec: column lengths differ")
        self.ts: memoryview | None = None
        if ts is not None:
            self.ts = _ints(ts, True)
            if len(self.ts) < n:
                raise ValueError("timestamps: buffer holds fewer than n int64s")

    def timestamp(self, row: int) -> int:
        return self.default_ts if self.ts is None else self.ts[row]

    def payload(self, row: int, out: list[Any]) -> int:
        """Append the key, value and headers sections of ``row`` to ``out``;
        return their size. Raises ValueError naming the column and row."""
        column = "keys"
        try:
            size = _field(None if self.keys is None else self.keys.cell(row), out)
            column = "values"
            size += _field(self.values.cell(row), out)
            column = "headers"
            if self.hoff is None:
                out.append(_ZERO)
                return size + 1
            return size + self._headers(row, out)
        except _Bad:
            raise _bad_cell(column, row) from None

    def _headers(self, row: int, out: list[Any]) -> int:
        assert self.hoff is not None
        assert self.hkeys is not None
        assert self.hvalues is not None
        valid = self.hvalid
        k = self.hvoff + row
        if valid is not None and not (valid[k >> 3] >> (k & 7)) & 1:
            start = stop = 0
        else:
            start, stop = self.hoff[row], self.hoff[row + 1]
            if start < 0 or stop < start or stop > self.hkeys.n:
                raise ValueError(
                    f"headers: row {row}: list offsets are not ascending or run past the entries"
                )
        head = _vz(stop - start)
        out.append(head)
        size = len(head)
        for j in range(start, stop):
            key = self.hkeys.cell(j)
            if key is None:
                raise ValueError(f"headers: row {row}: a header key is null")
            size += _field(key, out)
            size += _field(self.hvalues.cell(j), out)
        return size


def _field(cell: memoryview | None, out: list[Any]) -> int:
    """Append a nullable bytes field (length varint + bytes, or the null marker)."""
    if cell is None:
        out.append(_NULL)
        return 1
    head = _vz(len(cell))
    out.append(head)
    out.append(cell)
    return len(head) + len(cell)


def _selection(rows: Any, start: int, stop: int, n: int) -> Sequence[int]:
    if start < 0 or stop < start:
        raise ValueError(f"bad row range [{start}, {stop})")
    if rows is None:
        return range(start, stop)
    sel = _ints(rows, True)
    if len(sel) < stop:
        raise ValueError(f"rows: buffer holds fewer than {stop} int64s")
    return sel[start:stop]


def _check_row(row: int, n: int) -> None:
    if not 0 <= row < n:
        raise ValueError(f"row index {row} is outside the columns")


def encode_records(spec: tuple[Any, ...], rows: Any, start: int,
                   stop: int) -> tuple[bytes, int, int]:
    cols = _Cols(spec)
    if cols.hoff is not None:
        return _encode_general(cols, _selection(rows, start, stop, cols.n))
    # No headers (the bulk case): the key and value cells are read inline, with
    # the same checks in the same order as _Cols.payload (the general path).
    n = cols.n
    zz = _ZZ
    vals = cols.values
    voffs, vdata, vvalid, vbit, vsize = vals.off, vals.data, vals.valid, vals.voff, len(vals.data)
    keys = cols.keys
    if keys is not None:
        koffs, kdata, kvalid, kbit, ksize = keys.off, keys.data, keys.valid, keys.voff, len(keys.data)
    ts = cols.ts
    default = cols.default_ts
    parts: list[Any] = []
    add = parts.extend
    base = max_ts = 0
    for od, row in enumerate(_selection(rows, start, stop, n)):
        _check_row(row, n)
        t = default if ts is None else ts[row]
        if od:
            if t > max_ts:
                max_ts = t
        else:
            base = max_ts = t
        d = t - base
        tsd = zz[d] if 0 <= d < _TABLE else _zigzag_varint(d)
        odv = zz[od] if od < _TABLE else _zigzag_varint(od)
        if keys is None or (kvalid is not None
                            and not (kvalid[(kbit + row) >> 3] >> ((kbit + row) & 7)) & 1):
            kh: bytes = _NULL
            kb: Any = b""
        else:
            a, b = koffs[row], koffs[row + 1]
            if a < 0 or b < a or b > ksize:
                raise _bad_cell("keys", row)
            kb = kdata[a:b]
            kh = zz[b - a] if b - a < _TABLE else _zigzag_varint(b - a)
        if vvalid is not None and not (vvalid[(vbit + row) >> 3] >> ((vbit + row) & 7)) & 1:
            vh: bytes = _NULL
            vb: Any = b""
        else:
            a, b = voffs[row], voffs[row + 1]
            if a < 0 or b < a or b > vsize:
                raise _bad_cell("values", row)
            vb = vdata[a:b]
            vh = zz[b - a] if b - a < _TABLE else _zigzag_varint(b - a)
        size = 2 + len(tsd) + len(odv) + len(kh) + len(kb) + len(vh) + len(vb)
        add((zz[size] if size < _TABLE else _zigzag_varint(size), _ZERO, tsd, odv, kh, kb, vh,
             vb, _ZERO))
    return b"".join(parts), base, max_ts


def _bad_cell(column: str, row: int) -> ValueError:
    return ValueError(f"{column}: row {row}: offsets are not ascending or run past the data buffer")


def _encode_general(cols: _Cols, selection: Sequence[int]) -> tuple[bytes, int, int]:
    n = cols.n
    parts: list[Any] = []
    add = parts.append
    base = max_ts = 0
    payload: list[Any] = []
    for od, row in enumerate(selection):
        _check_row(row, n)
        ts = cols.timestamp(row)
        if od == 0:
            base = max_ts = ts
        elif ts > max_ts:
            max_ts = ts
        payload.clear()
        size = cols.payload(row, payload)
        tsd = _vz(ts - base)
        odv = _vz(od)
        add(_vz(1 + len(tsd) + len(odv) + size))
        add(_ZERO)
        add(tsd)
        add(odv)
        parts.extend(payload)
    return b"".join(parts), base, max_ts


def size_bounds(spec: tuple[Any, ...], out: Any) -> None:
    cols = _Cols(spec)
    dst = memoryview(out).cast("B")
    if len(dst) < cols.n * 8:
        raise ValueError("out: buffer holds fewer than n int64s")
    sizes = dst.cast("q")
    scratch: list[Any] = []
    for row in range(cols.n):
        scratch.clear()
        sizes[row] = _HEADER + _OVERHEAD + cols.payload(row, scratch)


def cut_batches(spec: tuple[Any, ...], rows: Any, start: int, stop: int, max_bytes: int,
                max_records: int) -> list[tuple[int, int]]:
    if max_records < 1:
        raise ValueError("max_records must be >= 1")
    cols = _Cols(spec)
    n = cols.n
    cuts: list[tuple[int, int]] = []
    base = size = in_batch = 0
    scratch: list[Any] = []
    for pos, row in enumerate(_selection(rows, start, stop, n), start):
        _check_row(row, n)
        scratch.clear()
        pay = cols.payload(row, scratch)
        ts = cols.timestamp(row)
        rec = 0
        if in_batch:
            body = 1 + _vz_size(ts - base) + _vz_size(in_batch) + pay
            rec = _vz_size(body) + body
            if in_batch >= max_records or size + rec > max_bytes:
                cuts.append((pos, size))
                in_batch = 0
        if not in_batch:
            base = ts
            size = _HEADER
            body = 3 + pay
            rec = _vz_size(body) + body
        size += rec
        in_batch += 1
    if in_batch:
        cuts.append((stop, size))
    return cuts


def pack_binary(seq: Sequence[Any], what: str) -> tuple[bytes, bytes, bytes | None, int]:
    if not isinstance(seq, list | tuple):
        raise TypeError("pack_binary needs a list or tuple")
    try:
        data = b"".join(seq)
    except TypeError:
        pass
    else:
        offsets = array("q", accumulate(map(len, seq), initial=0))
        if offsets[-1] == len(data):  # every item's len() is its byte count
            return offsets.tobytes(), data, None, 0
    return _pack_slow(seq, what)


def _pack_slow(seq: Sequence[Any], what: str) -> tuple[bytes, bytes, bytes | None, int]:
    parts: list[Any] = []
    offsets = array("q", [0])
    bits = bytearray((len(seq) + 7) // 8)
    total = nulls = 0
    for i, item in enumerate(seq):
        if item is None:
            nulls += 1
        else:
            bits[i >> 3] |= 1 << (i & 7)
            if type(item) is not bytes:
                item = _as_buffer(item, what, i)
            parts.append(item)
            total += len(item)
        offsets.append(total)
    return offsets.tobytes(), b"".join(parts), bytes(bits) if nulls else None, nulls


def _as_buffer(item: Any, what: str, i: int) -> bytes | memoryview:
    if isinstance(item, str):
        try:
            return item.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ValueError(f"{what}: row {i}: str is not encodable as UTF-8 ({exc})") from None
    try:
        view = memoryview(item)
    except TypeError:
        raise TypeError(
            f"{what}: row {i}: expected bytes, bytearray, memoryview, str (sent as UTF-8) or "
            f"None, not {type(item).__name__}: serialize it first"
        ) from None
    if not view.c_contiguous:
        raise TypeError(f"{what}: row {i}: {type(item).__name__} is not a contiguous buffer")
    return view.cast("B")


def pack_ints(seq: Sequence[Any], wide: bool) -> bytes | None:
    if not isinstance(seq, list | tuple):
        raise TypeError("pack_ints needs a list or tuple")
    top = _INT64_MAX if wide else _INT32_MAX
    if not all(type(v) is int and 0 <= v <= top for v in seq):
        return None  # (the C twin: an item that is not an exact int in range)
    return array("q" if wide else "i", seq).tobytes()


def find_outside(buf: Any, wide: bool, lo: int, hi: int) -> int:
    for i, v in enumerate(_ints(buf, wide)):
        if v < lo or v > hi:
            return i
    return -1


# ------------------------------------------------------------------ rows (decoding)


def _rd_vz(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    """A zigzag varint at ``pos`` (up to 10 bytes, not past ``end``): (value, next pos)."""
    z = 0
    shift = 0
    while pos < end:
        b = buf[pos]
        pos += 1
        z |= (b & 0x7F) << shift
        if b < 0x80:
            return (z >> 1) ^ -(z & 1), pos
        shift += 7
        if shift > 63:
            break
    raise _Bad


def _record_head(buf: bytes, pos: int,
                 end: int) -> tuple[int, int, int, int, int, int, int, int, int]:
    """``_kernel.c``'s ``rd_record``: the record at ``pos`` (before ``end``), its fields
    before the headers: (its end, the position of its first header entry, timestamp
    delta, offset delta, key length, key position, value length, value position, header
    entries); a length of -1 is null. Raises ValueError naming what is malformed."""
    if pos >= end:
        raise ValueError("batch holds fewer records than its count")
    what = "truncated record length"
    try:
        length, pos = _rd_vz(buf, pos, end)
        if length < 6 or length > end - pos:
            what = "bad record length"
            raise _Bad
        rec_end = pos + length
        what = "truncated record"
        tsd, p = _rd_vz(buf, pos + 1, rec_end)  # (past the attributes)
        od, p = _rd_vz(buf, p, rec_end)
        what = "bad key length"
        klen, p = _rd_vz(buf, p, rec_end)
        if klen < -1 or klen > rec_end - p:
            raise _Bad
        kp = p
        p += max(klen, 0)
        what = "bad value length"
        vlen, p = _rd_vz(buf, p, rec_end)
        if vlen < -1 or vlen > rec_end - p:
            raise _Bad
        vp = p
        p += max(vlen, 0)
        what = "bad header count"
        nh, p = _rd_vz(buf, p, rec_end)
        if nh < 0 or nh > rec_end - p:
            raise _Bad
    except _Bad:
        raise ValueError(what) from None
    return rec_end, p, tsd, od, klen, kp, vlen, vp, nh


def _header(buf: bytes, p: int, rec_end: int) -> tuple[int, int, int, int, int]:
    """``_kernel.c``'s ``rd_header``: the header entry at ``p``: (key position, key
    length, value position, value length or -1 for null, the position after it). The
    key's UTF-8 is the caller's to check."""
    what = "bad header key length"
    try:
        hk, p = _rd_vz(buf, p, rec_end)
        if hk < 0 or hk > rec_end - p:
            raise _Bad
        hkp = p
        p += hk
        what = "bad header value length"
        hv, p = _rd_vz(buf, p, rec_end)
        if hv < -1 or hv > rec_end - p:
            raise _Bad
    except _Bad:
        raise ValueError(what) from None
    return hkp, hk, p, hv, p + max(hv, 0)


def _header_key(buf: bytes, hkp: int, hk: int) -> str:
    try:
        return buf[hkp:hkp + hk].decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError("header key is not valid UTF-8") from None


def decode_rows(buf: bytes, start: int, end: int, count: int, row_type: type[tuple[Any, ...]],
                topic: str, partition: int, base_offset: int, min_offset: int, base_ts: int,
                stamp_ts: int, epoch: int, out: list[Any], /) -> None:
    """``_kernel.decode_rows``: one batch region's records as ``row_type`` rows."""
    if not issubclass(row_type, tuple):
        raise TypeError("row_type must be a tuple subclass")
    if start < 0 or end < start or end > len(buf):
        raise ValueError("record region outside the buffer")
    new = tuple.__new__
    pos = start
    for _ in range(count):
        rec_end, p, tsd, od, klen, kp, vlen, vp, nh = _record_head(buf, pos, end)
        pos = rec_end
        offset = base_offset + od
        keep = offset >= min_offset
        headers: list[tuple[str, bytes | None]] = []
        for _h in range(nh):
            hkp, hk, hvp, hv, p = _header(buf, p, rec_end)
            if keep:
                headers.append((_header_key(buf, hkp, hk),
                                None if hv < 0 else buf[hvp:hvp + hv]))
        if p != rec_end:
            raise ValueError("record length disagrees with its fields")
        if not keep:
            continue
        ts = stamp_ts if stamp_ts >= 0 else base_ts + tsd
        key = None if klen < 0 else buf[kp:kp + klen]
        value = None if vlen < 0 else buf[vp:vp + vlen]
        out.append(new(row_type, (topic, partition, offset, ts, key, value,
                                  tuple(headers), epoch)))
    if pos != end:
        raise ValueError("unexpected bytes after the last record")


_Q = struct.Struct("=q")
_I = struct.Struct("=i")
_ROWS_FIELDS: Final = 15  # the buffers decode_columns fills (their order: _kernel.c)


def _set_bit(bitmap: bytearray, row: int) -> None:
    bitmap[row >> 3] |= 1 << (row & 7)


def _bitmap_to(bitmap: bytearray, rows: int) -> None:
    """Zero-fill ``bitmap`` to hold ``rows`` bits."""
    want = (rows + 7) // 8
    if want > len(bitmap):
        bitmap.extend(bytes(want - len(bitmap)))


def decode_columns(buf: bytes, start: int, end: int, count: int, base_offset: int,
                   min_offset: int, base_ts: int, stamp_ts: int, epoch: int, out: list[Any],
                   lens: Any, /) -> None:
    """``_kernel.decode_columns``: one batch region's records appended to the column
    buffers ``out`` (their layout: ``_kernel.c``), byte for byte as the C kernel; this
    one reserves no room, so each buffer's length in use (``lens``) is its length."""
    sizes = memoryview(lens).cast("B").cast("q")
    if len(sizes) != _ROWS_FIELDS:
        raise ValueError(f"lens must hold {_ROWS_FIELDS} int64")
    if len(out) != _ROWS_FIELDS:
        raise ValueError(f"out must hold {_ROWS_FIELDS} bytearrays")
    if not all(type(b) is bytearray for b in out):
        raise TypeError("out must hold bytearrays")
    for i, b in enumerate(out):
        if not 0 <= sizes[i] <= len(b):
            raise ValueError("lens: a length outside its buffer")
        del b[sizes[i]:]
    try:
        _decode_columns(buf, start, end, count, base_offset, min_offset, base_ts, stamp_ts,
                        epoch, out)
    finally:
        for i, b in enumerate(out):
            sizes[i] = len(b)


def _decode_columns(buf: bytes, start: int, end: int, count: int, base_offset: int,
                    min_offset: int, base_ts: int, stamp_ts: int, epoch: int,
                    out: list[Any]) -> None:
    if start < 0 or end < start or end > len(buf):
        raise ValueError("record region outside the buffer")
    if count < 0:
        raise ValueError("negative record count")
    (offsets, timestamps, epochs, key_offsets, key_data, key_valid, value_offsets,
     value_data, value_valid, header_offsets, hkey_offsets, hkey_data, hvalue_offsets,
     hvalue_data, hvalue_valid) = out
    n = len(offsets) // 8
    entries = len(hkey_offsets) // 8 - 1
    pack_q, pack_i = _Q.pack, _I.pack
    pos = start
    for _ in range(count):
        rec_end, p, tsd, od, klen, kp, vlen, vp, nh = _record_head(buf, pos, end)
        pos = rec_end
        offset = base_offset + od
        keep = offset >= min_offset
        for _h in range(nh):
            hkp, hk, hvp, hv, p = _header(buf, p, rec_end)
            if keep:
                _header_key(buf, hkp, hk)
                hkey_data += buf[hkp:hkp + hk]
                hkey_offsets += pack_q(len(hkey_data))
                _bitmap_to(hvalue_valid, entries + 1)
                if hv >= 0:
                    hvalue_data += buf[hvp:hvp + hv]
                    _set_bit(hvalue_valid, entries)
                hvalue_offsets += pack_q(len(hvalue_data))
                entries += 1
        if p != rec_end:
            raise ValueError("record length disagrees with its fields")
        if not keep:
            continue
        offsets += pack_q(offset)
        timestamps += pack_q(stamp_ts if stamp_ts >= 0 else base_ts + tsd)
        epochs += pack_i(epoch)
        _bitmap_to(key_valid, n + 1)
        _bitmap_to(value_valid, n + 1)
        if klen >= 0:
            key_data += buf[kp:kp + klen]
            _set_bit(key_valid, n)
        key_offsets += pack_q(len(key_data))
        if vlen >= 0:
            value_data += buf[vp:vp + vlen]
            _set_bit(value_valid, n)
        value_offsets += pack_q(len(value_data))
        header_offsets += pack_q(entries)
        n += 1
    if pos != end:
        raise ValueError("unexpected bytes after the last record")


def binary_list(spec: tuple[Any, ...], /) -> list[bytes | None]:
    """``_kernel.binary_list``: a binary column spec's cells as bytes / None."""
    col = _Bin(spec, "binary")
    out: list[bytes | None] = []
    for row in range(col.n):
        try:
            cell = col.cell(row)
        except _Bad:
            raise ValueError(f"binary: row {row}: offsets are not ascending or run past the "
                             "data buffer") from None
        out.append(None if cell is None else bytes(cell))
    return out
