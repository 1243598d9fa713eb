"""Reading a submitted PNG far enough to tell a plot from a placeholder: its size, its pixels, its text chunks.

The figures check wants a real plot of the student's data: a picture big
enough to read, with something drawn on it, that says which of the
submitted CSV files it was drawn from (matplotlib writes that when asked:
`savefig(path, metadata={"Source": "results/summary.csv"})`). A 1x1 PNG or
a blank canvas is a file, not a figure.

Written with zlib alone (no imaging library in the grader): non-interlaced
8-bit images of every PNG colour type, which is what matplotlib and most
plotting tools write; anything else is reported as unreadable, never
guessed at. Decompression is capped, so a crafted file cannot exhaust the
grader's memory.
"""
from __future__ import annotations

import struct
import zlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

MAGIC = b"\x89PNG\r\n\x1a\n"
MAX_PIXELS = 40_000_000
CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}      # colour type -> samples per pixel


class PngError(ValueError):
    """A file the reader cannot read as a PNG; the message says why."""


@dataclass
class Png:
    width: int
    height: int
    text: dict[str, str] = field(default_factory=dict)
    colours: Counter = field(default_factory=Counter)     # pixel value -> count, over a sample of rows

    def drawn_fraction(self) -> float:
        """The share of sampled pixels that differ from the most common one (the background)."""
        total = sum(self.colours.values())
        return 0.0 if not total else 1 - self.colours.most_common(1)[0][1] / total


def _chunks(data: bytes):
    position = len(MAGIC)
    while position + 8 <= len(data):
        length, kind = struct.unpack(">I4s", data[position:position + 8])
        body = data[position + 8:position + 8 + length]
        if len(body) != length:
            raise PngError("a chunk runs past the end of the file")
        yield kind, body
        position += 12 + length


def _unfilter(raw: bytes, width: int, height: int, bpp: int, rows: set[int]) -> dict[int, bytes]:
    """The unfiltered scanlines of the rows asked for (every row is unfiltered: filters chain down the image)."""
    stride = width * bpp
    previous = bytearray(stride)
    out = {}
    for y in range(height):
        start = y * (stride + 1)
        kind, line = raw[start], bytearray(raw[start + 1:start + 1 + stride])
        if len(line) != stride:
            raise PngError("the image data is shorter than its size says")
        for x in range(stride):
            a = line[x - bpp] if x >= bpp else 0
            b = previous[x]
            c = previous[x - bpp] if x >= bpp else 0
            if kind == 1:
                line[x] = (line[x] + a) & 0xFF
            elif kind == 2:
                line[x] = (line[x] + b) & 0xFF
            elif kind == 3:
                line[x] = (line[x] + (a + b) // 2) & 0xFF
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 0xFF
            elif kind != 0:
                raise PngError(f"unknown row filter {kind}")
        if y in rows:
            out[y] = bytes(line)
        previous = line
    return out


def read_png(path: Path, sample_rows: int = 48) -> Png:
    data = path.read_bytes()
    if not data.startswith(MAGIC):
        raise PngError("not a PNG file")
    header, text, idat = None, {}, []
    for kind, body in _chunks(data):
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body[:13])
        elif kind == b"tEXt" and b"\0" in body:
            key, value = body.split(b"\0", 1)
            text[key.decode("latin-1")] = value.decode("latin-1")
        elif kind == b"iTXt" and b"\0" in body:
            key, rest = body.split(b"\0", 1)
            if rest[:1] == b"\0":                            # uncompressed: flag, method, language, keyword
                parts = rest[2:].split(b"\0", 2)
                if len(parts) == 3:
                    text[key.decode("latin-1")] = parts[2].decode("utf-8", "replace")
        elif kind == b"IDAT":
            idat.append(body)
    if header is None:
        raise PngError("no IHDR chunk")
    width, height, depth, colour, _, _, interlace = header
    if width * height > MAX_PIXELS or not width or not height:
        raise PngError(f"{width}x{height} pixels is out of range")
    if depth != 8 or colour not in CHANNELS or interlace:
        raise PngError("only non-interlaced 8-bit PNGs are read (matplotlib's savefig writes those)")
    bpp = CHANNELS[colour]
    expected = height * (width * bpp + 1)
    inflater = zlib.decompressobj()
    raw = inflater.decompress(b"".join(idat), expected + 1)
    if len(raw) < expected:
        raise PngError("the image data is shorter than its size says")
    step = max(1, height // sample_rows)
    rows = _unfilter(raw[:expected], width, height, bpp, set(range(0, height, step)))
    colours: Counter = Counter()
    for line in rows.values():
        colours.update(line[i:i + bpp] for i in range(0, len(line), bpp))
    return Png(width, height, text, colours)
