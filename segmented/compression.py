"""The compression codecs of record batch v2 (attributes bits 0-2), inflate side.

Compressed batches are stored as their producer sent them (the broker's in-place
append), so every reader of the ``.log`` inflates: the engine's decoder
(``record_batch``), the cleaner through it, and the broker's produce checks.

Codecs and their maintained libraries: 1 gzip (zlib), 2 snappy (python-snappy; raw,
or in xerial blocks as Java producers and librdkafka write it), 3 lz4 (lz4.frame),
4 zstd (zstandard). 5 to 7 are unknown.

Bound: a batch inflates to at most ``INFLATED_BYTES_MAX`` (a decompression bomb in a
100 MiB frame, or in a file, must not take the process's memory); each codec is
stopped before it inflates past it.
"""

from __future__ import annotations

import struct
import zlib
from typing import Final

__all__ = [
    "CODEC_NAMES",
    "INFLATED_BYTES_MAX",
    "CodecUnavailableError",
    "InflateError",
    "InflateLimitError",
    "inflate",
]

CODEC_NAMES: Final = ("none", "gzip", "snappy", "lz4", "zstd")  # attributes bits 0-2
#: A compressed batch inflates to at most this; more is refused. Kafka's own default
#: message.max.bytes is 1 MiB compressed; 64 MiB of records is far above any client.
INFLATED_BYTES_MAX: Final = 64 << 20
#: xerial snappy framing: a 16-byte header (magic, version, compat), then blocks of
#: int32 size + raw snappy bytes.
XERIAL_MAGIC: Final = b"\x82SNAPPY\x00"
XERIAL_HEADER_BYTES: Final = 16
_BLOCK_SIZE: Final = struct.Struct(">i")
_GZIP_WBITS: Final = 31  # a gzip header and trailer around the deflate stream


class InflateError(ValueError):
    """The bytes do not inflate with their codec."""


class InflateLimitError(InflateError):
    """They would inflate past the bound."""


class CodecUnavailableError(InflateError):
    """The codec is unknown, or its library is not installed."""


def inflate(codec: int, body: bytes | memoryview, limit: int = INFLATED_BYTES_MAX) -> bytes:
    """The records of a compressed batch, at most ``limit`` bytes.

    Raises:
        InflateError: the body does not inflate (cut short, corrupt).
        InflateLimitError: it inflates past ``limit``.
        CodecUnavailableError: an unknown codec, or its library is missing.
    """
    if not 1 <= codec < len(CODEC_NAMES):
        raise CodecUnavailableError(f"unknown codec {codec}")
    name = CODEC_NAMES[codec]
    try:
        if name == "gzip":
            inflater = zlib.decompressobj(wbits=_GZIP_WBITS)
            out = inflater.decompress(body, limit + 1)
            if not inflater.eof and len(out) <= limit:
                raise InflateError("gzip stream cut short")
        elif name == "snappy":
            out = _inflate_snappy(bytes(body), limit)
        elif name == "lz4":
            import lz4.frame

            out = lz4.frame.LZ4FrameDecompressor().decompress(body, max_length=limit + 1)
        else:
            import zstandard

            with zstandard.ZstdDecompressor().stream_reader(body, read_across_frames=True) as r:
                out = r.read(limit + 1)
    except InflateError:
        raise
    except ImportError:
        raise CodecUnavailableError(f"{name}: its library is not installed") from None
    except Exception as error:  # each library raises its own error types
        raise InflateError(f"{name} does not inflate: {error}") from None
    if len(out) > limit:
        raise InflateLimitError(f"{name} inflates past {limit} bytes")
    return bytes(out)


def _inflate_snappy(data: bytes, limit: int) -> bytes:
    """Snappy, raw or in xerial blocks. Every raw block starts with its inflated
    length, so the bound is checked first."""
    import snappy

    blocks: list[bytes] = []
    if data[: len(XERIAL_MAGIC)] == XERIAL_MAGIC:
        position = XERIAL_HEADER_BYTES
        while position < len(data):
            (size,) = _BLOCK_SIZE.unpack_from(data, position)
            position += _BLOCK_SIZE.size
            if size < 0 or position + size > len(data):
                raise InflateError("snappy block cut short")
            blocks.append(data[position : position + size])
            position += size
    else:
        blocks.append(data)
    if sum(map(_snappy_length, blocks)) > limit:
        raise InflateLimitError(f"snappy inflates past {limit} bytes")
    return b"".join(snappy.decompress(block) for block in blocks)


def _snappy_length(block: bytes) -> int:
    """The inflated length a raw snappy block declares (a little-endian base-128
    varint of at most 5 bytes)."""
    length = shift = 0
    for byte in block[:5]:
        length |= (byte & 0x7F) << shift
        if byte < 0x80:
            return length
        shift += 7
    raise InflateError("snappy block without a length")
