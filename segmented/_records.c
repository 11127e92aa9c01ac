/*
 * commitlog._native, part five: the records of a Kafka record batch v2, walked
 * (built into the same module; segmented/record_batch.py declares the contract and
 * holds the pure-Python twin, record_spans_py; tests/segmented/test_record_batch.py
 * compares them and tests/commitlog/test_native_fuzz.py fuzzes them).
 *
 * record_spans(buffer, start, end, count, last_delta) -> bytes
 *   The records of a batch whose header was checked: they lie in buffer[start:end]
 *   (start = the batch start + 61, end = the batch end), ``count`` of them, the last
 *   at offset delta ``last_delta``. Returns count * 7 native int64, per record:
 *   [offset delta, key start, key size (-1: null), value start, value size (-1:
 *   null), record start (its length varint), timestamp delta], positions absolute
 *   in buffer; a record ends where the next one starts, the last one at ``end``.
 *   Every field is checked as Kafka's DefaultRecord.readFrom checks it: zig-zag
 *   varints of at most 10 bytes, sizes >= -1, every span inside its record, header
 *   keys not null, the record filling exactly its length, the records filling the
 *   batch exactly; offset deltas equal to the index in a dense batch (count ==
 *   last_delta + 1), else strictly increasing up to last_delta (a compacted batch).
 *   A failure raises ValueError((position, reason)) with the position in buffer.
 *
 * The cleaner (segmented/cleaner.py) maps keys and copies kept records from these
 * spans without decoding each record into Python objects. It does not release the
 * GIL: one call walks one batch (at most a few MiB), and the caller needs the result
 * at once.
 */
#include "../commitlog/_native.h"

#define FIELDS 7

static PyObject *malformed(Py_ssize_t position, const char *reason) {
    /* One argument, the (position, reason) pair: ValueError((position, reason)). */
    PyObject *args = Py_BuildValue("((ns))", position, reason);
    if (args != NULL) {
        PyErr_SetObject(PyExc_ValueError, args);
        Py_DECREF(args);
    }
    return NULL;
}

/* A zig-zag varint at *pos, read below limit; 0, or -1 (cut off) / -2 (too long:
 * more than 10 bytes, or a 10th byte with bits past the 64th, which the Python
 * readers would keep and this walk would drop: both refuse it). */
static int read_zigzag(const uint8_t *p, Py_ssize_t limit, Py_ssize_t *pos, int64_t *out) {
    uint64_t result = 0;
    for (int shift = 0; shift < 70; shift += 7) {
        if (*pos >= limit) return -1;
        uint8_t byte = p[(*pos)++];
        if (shift == 63 && byte > 1) return -2;
        result |= (uint64_t)(byte & 0x7F) << shift;
        if (!(byte & 0x80)) {
            *out = (int64_t)(result >> 1) ^ -(int64_t)(result & 1);
            return 0;
        }
    }
    return -2;
}

PyObject *mqstore_record_spans(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "record_spans(buffer, start, end, count, last_delta)");
        return NULL;
    }
    int64_t start, end, count, last_delta;
    if (as_i64(args[1], &start) < 0 || as_i64(args[2], &end) < 0 ||
        as_i64(args[3], &count) < 0 || as_i64(args[4], &last_delta) < 0)
        return NULL;
    Py_buffer view;
    if (get_bytes(args[0], &view, "buffer") < 0) return NULL;
    const uint8_t *p = view.buf;
    PyObject *result = NULL;
    if (start < 0 || end < start || end > view.len) {
        PyErr_SetString(PyExc_ValueError, "record_spans: need 0 <= start <= end <= len(buffer)");
        goto done;
    }
    /* A record takes at least 7 bytes: this bounds the output by the input. */
    if (count < 0 || count > (end - start) / 7 + 1 || last_delta < -1) {
        malformed((Py_ssize_t)start, "impossible record count or last offset delta");
        goto done;
    }
    result = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(count * FIELDS * 8));
    if (result == NULL) goto done;
    int64_t *row = (int64_t *)PyBytes_AS_STRING(result);
    int dense = count - 1 == last_delta; /* count >= 0: no overflow at INT64_MAX */
    int64_t previous = -1;
    Py_ssize_t cursor = (Py_ssize_t)start;
    const Py_ssize_t limit = (Py_ssize_t)end;
    for (int64_t index = 0; index < count; index++, row += FIELDS) {
        const Py_ssize_t record_start = cursor;
        int64_t length, stamp_delta, delta, key_size, value_size, headers;
        if (read_zigzag(p, limit, &cursor, &length) < 0 || length < 0 || length > limit - cursor) {
            malformed(record_start, "record length");
            goto fail;
        }
        const Py_ssize_t record_end = cursor + (Py_ssize_t)length;
        cursor += 1; /* attributes */
        if (cursor > record_end || read_zigzag(p, record_end, &cursor, &stamp_delta) < 0 ||
            read_zigzag(p, record_end, &cursor, &delta) < 0) {
            malformed(record_start, "record does not decode");
            goto fail;
        }
        if (dense ? delta != index : !(previous < delta && delta <= last_delta)) {
            malformed(cursor, "offset delta out of order");
            goto fail;
        }
        previous = delta;
        /* A varint that does not read is reported where it starts; a size out of
         * bounds where its span would start (as the twin does). */
        Py_ssize_t at = cursor;
        if (read_zigzag(p, record_end, &cursor, &key_size) < 0) {
            malformed(at, "key size");
            goto fail;
        }
        if (key_size < -1 || key_size > record_end - cursor) {
            malformed(cursor, "key size");
            goto fail;
        }
        const Py_ssize_t key_start = cursor;
        if (key_size > 0) cursor += (Py_ssize_t)key_size;
        at = cursor;
        if (read_zigzag(p, record_end, &cursor, &value_size) < 0) {
            malformed(at, "value size");
            goto fail;
        }
        if (value_size < -1 || value_size > record_end - cursor) {
            malformed(cursor, "value size");
            goto fail;
        }
        const Py_ssize_t value_start = cursor;
        if (value_size > 0) cursor += (Py_ssize_t)value_size;
        at = cursor;
        if (read_zigzag(p, record_end, &cursor, &headers) < 0) {
            malformed(at, "header count");
            goto fail;
        }
        if (headers < 0 || headers > record_end - cursor) {
            malformed(cursor, "header count");
            goto fail;
        }
        for (int64_t h = 0; h < headers; h++) {
            int64_t header_key, header_value;
            at = cursor;
            if (read_zigzag(p, record_end, &cursor, &header_key) < 0) {
                malformed(at, "header key");
                goto fail;
            }
            if (header_key < 0 || header_key > record_end - cursor) {
                malformed(cursor, "header key");
                goto fail;
            }
            cursor += (Py_ssize_t)header_key;
            at = cursor;
            if (read_zigzag(p, record_end, &cursor, &header_value) < 0) {
                malformed(at, "header value");
                goto fail;
            }
            if (header_value < -1 || header_value > record_end - cursor) {
                malformed(cursor, "header value");
                goto fail;
            }
            if (header_value > 0) cursor += (Py_ssize_t)header_value;
        }
        if (cursor != record_end) {
            malformed(cursor, "record does not fill its length");
            goto fail;
        }
        row[0] = delta;
        row[1] = key_start;
        row[2] = key_size;
        row[3] = value_start;
        row[4] = value_size;
        row[5] = record_start;
        row[6] = stamp_delta;
    }
    if (cursor != limit) {
        malformed(cursor, "bytes left over after the records");
        goto fail;
    }
    goto done;
fail:
    Py_CLEAR(result);
done:
    release(&view);
    return result;
}
