"""Zero-copy Fetch on the segmented engine: the ``.log`` files are the wire format.

A FetchResponse (v4 to v11, the non-flexible versions served) is framed here rather
than by kafka-python's classes, because each partition's records are not bytes in
memory but file ranges (mqstore.segmented.file_records) that the server sends with
``os.sendfile`` from the segment's descriptor to the socket (``loop.sendfile``)::

    size int32 | correlation_id int32 | throttle_time_ms int32
    | error_code int16 (v7+) | session_id int32 (v7+)
    | topics int32 | per topic: name int16 + UTF-8 | partitions int32
      | per partition: partition_index int32 | error_code int16
        | high_watermark int64 | last_stable_offset int64 | log_start_offset int64 (v5+)
        | aborted_transactions int32 (-1: null) | preferred_read_replica int32 (v11+)
        | records int32 (their size) | records: the file ranges, sent by sendfile

``ZeroCopyResponse`` is that frame as parts (bytes, then ``FileSlice``s, in order)
plus the ``FileSlices`` whose pins it holds: whoever holds one must ``release`` it,
sent or not. TLS connections cannot sendfile (the bytes are encrypted in user space)
and take the copying path: the same file ranges read with pread (``SegmentLog.fetch``);
the CommitLog engine builds its batches (mqstore.broker.log).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Sequence
from typing import Any, Final

from mqstore.broker.batch import CORRUPT_MESSAGE, InvalidBatchError, ProducedBatch
from mqstore.broker.log import Appended, RecordLog
from mqstore.commitlog.batch import Trailer
from mqstore.commitlog.errors import CorruptDataError, InvalidArgumentError, InvalidRecordError
from mqstore.segmented.file_records import FileSlice, FileSlices

__all__ = ["ZERO_COPY_VERSIONS", "SegmentLog", "ZeroCopyResponse", "encode_fetch"]

#: The Fetch versions framed here: the served ones (non-flexible; v12 adds tags).
ZERO_COPY_VERSIONS: Final = range(4, 12)
_SIZE: Final = struct.Struct(">i")  # a frame's size, an array's count, a bytes' length
_HEAD_V4: Final = struct.Struct(">ii")  # correlation_id, throttle_time_ms
_HEAD_V7: Final = struct.Struct(">iihi")  # ... error_code, session_id
_NAME: Final = struct.Struct(">h")  # a string's length
_PARTITION_V4: Final = struct.Struct(">ihqq")  # index, error, high watermark, LSO
_PARTITION_V5: Final = struct.Struct(">ihqqq")  # ... log_start_offset
_ABORTED: Final = struct.Struct(">qq")  # producer_id, first_offset
_REPLICA: Final = struct.Struct(">i")  # preferred_read_replica (v11+)
NULL: Final = -1


class SegmentLog(RecordLog):
    """``RecordLog`` over the segmented engine: a producer's batch is stored as it is
    (the engine's ``append_batch``), and Fetch reads file ranges."""

    def append(
        self, topic: str, partition: int, batch: ProducedBatch, trailer: Trailer | None = None
    ) -> Appended:
        """Append a checked batch as it is, compressed or not, so its bytes and CRC
        are what the consumer gets (the engine inflates it to check its records).
        The segmented engine keeps no trailer (its producer state is a journal).

        Raises:
            InvalidBatchError: the records do not decode (nothing appended).
            StoreError: as ``append_records`` raises (e.g. a record without a key
                on a compacted topic, InvalidRecordError).
        """
        assert trailer is None, "the segmented engine takes no trailer"
        try:
            appended = self.engine.append_batch(  # type: ignore[attr-defined]
                topic, partition, batch.data
            )
        except InvalidRecordError:
            raise  # INVALID_RECORD (handlers.error_for)
        except InvalidArgumentError as error:  # what check_produced let through
            raise InvalidBatchError(str(error), CORRUPT_MESSAGE) from None
        config = self.engine.describe_topic(topic)
        stamp = appended.max_timestamp_ms if config.timestamp_type == "LogAppendTime" else -1
        return Appended(appended.base_offset, stamp, self.log_start_offset(topic, partition))

    def fetch(self, topic: str, partition: int, offset: int, max_bytes: int) -> list[bytes]:
        """The copying Fetch (TLS, or ``zero_copy_fetch`` off): the stored batches of
        ``fetch_slices`` read with pread, as they are on disk, not decoded and built
        again: the bytes sendfile would have sent.

        Raises:
            OffsetOutOfRangeError, UnknownTopicError, CorruptDataError: as
                ``fetch_slices``; CorruptDataError also for a file cut short under
                its pin.
        """
        with self.engine.read_slices(topic, partition, offset, max_bytes) as slices:  # type: ignore[attr-defined]
            return [_read_slice(piece) for piece in slices.slices]

    def fetch_slices(self, topic: str, partition: int, offset: int, max_bytes: int) -> FileSlices:
        """Pinned file ranges of whole batches from ``offset`` (at least one, then up
        to ``max_bytes``); the caller releases them. Read ahead into the page cache
        here, on a worker, so that the event loop's sendfile does not wait on the disk
        (a hint only: Kafka's network threads have the same exposure, KAFKA-7504).

        Raises:
            OffsetOutOfRangeError, UnknownTopicError, CorruptDataError: as the engine's
                ``read_slices`` raises them.
        """
        slices: FileSlices = self.engine.read_slices(  # type: ignore[attr-defined]
            topic, partition, offset, max_bytes
        )
        slices.advise_willneed()
        return slices


def _read_slice(piece: FileSlice) -> bytes:
    """The bytes of one pinned file range (pread until whole)."""
    parts: list[bytes] = []
    done = 0
    while done < piece.size_bytes:
        got = os.pread(piece.fileno(), piece.size_bytes - done, piece.position + done)
        if not got:
            raise CorruptDataError(
                piece.segment.log_path, piece.position + done, "the file ends inside a batch"
            )
        parts.append(got)
        done += len(got)
    return parts[0] if len(parts) == 1 else b"".join(parts)


class ZeroCopyResponse:
    """A framed FetchResponse as bytes and file ranges, holding the ranges' pins."""

    __slots__ = ("files", "parts", "size_bytes")

    def __init__(self, parts: list[bytes | FileSlice], files: Sequence[FileSlices]) -> None:
        self.parts = parts
        self.files = tuple(files)
        self.size_bytes = sum(len(p) if isinstance(p, bytes) else p.size_bytes for p in parts)

    @property
    def file_bytes(self) -> int:
        return sum(f.size_bytes for f in self.files)

    @property
    def records_count(self) -> int:
        return sum(f.records_count for f in self.files)

    def release(self) -> None:
        for slices in self.files:
            slices.release()


def encode_fetch(
    response: Any, correlation_id: int, files: dict[tuple[int, int], FileSlices]
) -> ZeroCopyResponse:
    """Frame ``response`` (a kafka-python FetchResponse whose partitions at the
    (topic index, partition index) keys of ``files`` hold no records: theirs are the
    file ranges there). Other partitions' ``records`` are sent as they are.

    Raises nothing for the world: ``response`` is ours. On a bug, the pins of
    ``files`` are released before the error leaves.
    """
    version = response.version
    assert version in ZERO_COPY_VERSIONS
    try:
        return _encode(response, version, correlation_id, files)
    except BaseException:
        for slices in files.values():
            slices.release()
        raise


def _encode(
    response: Any, version: int, correlation_id: int, files: dict[tuple[int, int], FileSlices]
) -> ZeroCopyResponse:
    parts: list[bytes | FileSlice] = []
    head: list[bytes] = []
    if version >= 7:
        head.append(_HEAD_V7.pack(correlation_id, 0, response.error_code, response.session_id))
    else:
        head.append(_HEAD_V4.pack(correlation_id, 0))
    head.append(_SIZE.pack(len(response.responses)))
    for t, topic in enumerate(response.responses):
        name = topic.topic.encode()
        head += (_NAME.pack(len(name)), name, _SIZE.pack(len(topic.partitions)))
        for p, part in enumerate(topic.partitions):
            if version >= 5:
                head.append(
                    _PARTITION_V5.pack(
                        part.partition_index, part.error_code, part.high_watermark,
                        part.last_stable_offset, part.log_start_offset,
                    )
                )  # fmt: skip
            else:
                head.append(
                    _PARTITION_V4.pack(
                        part.partition_index, part.error_code, part.high_watermark,
                        part.last_stable_offset,
                    )
                )  # fmt: skip
            aborted = part.aborted_transactions
            if aborted is None:
                head.append(_SIZE.pack(NULL))
            else:
                head.append(_SIZE.pack(len(aborted)))
                head += [_ABORTED.pack(a.producer_id, a.first_offset) for a in aborted]
            if version >= 11:
                head.append(_REPLICA.pack(part.preferred_read_replica))
            slices = files.get((t, p))
            if slices is not None:
                head.append(_SIZE.pack(slices.size_bytes))
                parts.append(b"".join(head))
                head = []
                parts += slices.slices
            elif part.records is None:
                head.append(_SIZE.pack(NULL))
            else:
                records = bytes(part.records)
                head += (_SIZE.pack(len(records)), records)
    if head:
        parts.append(b"".join(head))
    body_bytes = sum(len(p) if isinstance(p, bytes) else p.size_bytes for p in parts)
    parts[0] = _SIZE.pack(body_bytes) + parts[0]  # type: ignore[operator]
    return ZeroCopyResponse(parts, list(files.values()))
