/*
 * commitlog._native, the checks of records already written: scan_records (the
 * recovery scan's walk of a file, verifying every record, optionally giving the
 * dispatch columns), verify_records (the checksums of records at known positions)
 * and gather (copy many byte ranges into one buffer). commitlog/record_read.py holds
 * the pure-Python twin of each; tests/commitlog/test_native.py compares them and
 * tests/commitlog/test_native_fuzz.py fuzzes them. All run without the GIL.
 */
#include "_native.h"

/* ------------------------------------------------------------------ scan_records() */

/* scan_records(buffer, start, limit, file_start, positions, sizes, queue_offsets,
 *              queue_ids, store_ts, topic_lens, topic_hashes[, dispatch])
 *     -> (end, count, status, closed)
 * Walk and fully verify records from start (as record.decode does: size, magic,
 * checksum, physical offset, section lengths, flags, ASCII topic, UTF-8 tag) until
 * the output arrays are full (status 0), zeros (1: the unwritten rest of the file),
 * a blank record (2: end is then the file's end), a record that does not verify
 * (3: end is where it starts), or limit (4). Outputs are per verified record: its
 * position in the file, total size, queue offset, queue id, store timestamp, topic
 * length and XXH64 of the topic bytes. closed: how many of the count records end
 * with one that closes its append group (the last without FLAG_GROUP_OPEN; 0: none
 * does). dispatch (optional, None: none): an int64 array of DISPATCH_ROWS rows of a
 * width of at least the outputs' capacity (C order), given the records' columns as
 * dispatch_columns writes them, from the header just verified, INSTEAD of the outputs
 * (left as they are; they still set the capacity): the recovery scan then dispatches
 * without a second walk of the log, and writes one set of columns, not two (18
 * streams of stores cost a third more per record than 11). Runs without the GIL. */
PyObject *mqstore_scan_records(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 11 && nargs != 12) {
        PyErr_SetString(PyExc_TypeError, "scan_records takes 11 or 12 arguments");
        return NULL;
    }
    int64_t start, limit, file_start;
    if (as_i64(args[1], &start) < 0 || as_i64(args[2], &limit) < 0 ||
        as_i64(args[3], &file_start) < 0)
        return NULL;
    Py_buffer views[9];
    int got = 0;
    PyObject *result = NULL;
    if (PyObject_GetBuffer(args[0], &views[0], PyBUF_SIMPLE) < 0) return NULL;
    got = 1;
    static const Py_ssize_t itemsizes[8] = {0, 8, 4, 8, 4, 8, 1, 8};
    static const char *const names[8] = {"",          "positions", "sizes",      "queue_offsets",
                                         "queue_ids", "store_ts",  "topic_lens", "topic_hashes"};
    for (; got < 8; got++)
        if (get_array(args[got + 3], &views[got], itemsizes[got], 1, names[got]) < 0) goto done;
    int with_dispatch = nargs == 12 && args[11] != Py_None;
    if (with_dispatch) {
        if (get_array(args[11], &views[8], 8, 1, "dispatch") < 0) goto done;
        got = 9;
    }
    Py_ssize_t capacity = views[1].len / 8;
    int short_output = 0;
    for (int k = 2; k < 8; k++) short_output |= views[k].len / itemsizes[k] < capacity;
    /* The dispatch rows: DISPATCH_ROWS of one width, each at least capacity long. */
    Py_ssize_t width = with_dispatch ? views[8].len / 8 / DISPATCH_ROWS : 0;
    if (with_dispatch)
        short_output |= views[8].len != width * 8 * DISPATCH_ROWS || width < capacity;
    /* 0 <= start <= limit <= len, and file_start + limit does not wrap: every sum
     * below (at + total, file_start + at) is then exact. */
    if (short_output || start < 0 || start > limit || limit > views[0].len || file_start < 0 ||
        file_start > INT64_MAX - limit) {
        PyErr_SetString(PyExc_ValueError, "scan_records: outputs too short, bad range or start");
        goto done;
    }
    const uint8_t *base = views[0].buf;
    int64_t *pos_out = views[1].buf, *qoff_out = views[3].buf, *ts_out = views[5].buf;
    int32_t *size_out = views[2].buf, *qid_out = views[4].buf;
    uint8_t *tlen_out = views[6].buf;
    uint64_t *thash_out = views[7].buf;
    int64_t *rows = with_dispatch ? views[8].buf : NULL;
    int64_t at = start;
    Py_ssize_t count = 0, closed = 0;
    int status = SCAN_LIMIT;
    TopicMemo memo;
    topic_memo_init(&memo);
    Py_BEGIN_ALLOW_THREADS
    while (1) {
        if (count == capacity) {
            status = SCAN_FULL;
            break;
        }
        if (limit - at < BLANK_SIZE) {
            status = SCAN_LIMIT;
            break;
        }
        const uint8_t *rec = base + at;
        uint32_t total = read32(rec), magic = read32(rec + 4);
        if (total == 0 && magic == 0) {
            status = SCAN_ZEROS;
            break;
        }
        uint64_t stored = read64(rec + 8);
        if (magic == BLANK_MAGIC) {
            uint64_t seed = (uint64_t)total | ((uint64_t)BLANK_MAGIC << 32);
            if (total < BLANK_SIZE || total > limit - at || xxh64(rec, 0, seed) != stored) {
                status = SCAN_INVALID;
            } else {
                status = SCAN_BLANK;
                at += total;
            }
            break;
        }
        if (magic != MESSAGE_MAGIC || total < HEADER_SIZE || total > limit - at) {
            status = SCAN_INVALID;
            break;
        }
        uint64_t seed = (uint64_t)total | ((uint64_t)MESSAGE_MAGIC << 32);
        if (xxh64(rec + BLANK_SIZE, total - BLANK_SIZE, seed) != stored) {
            status = SCAN_INVALID;
            break;
        }
        int64_t physical;
        memcpy(&physical, rec + 24, 8);
        uint32_t flags = read32(rec + 52), body_len = read32(rec + 56),
                 props_len = read32(rec + 60);
        uint16_t keys_len;
        memcpy(&keys_len, rec + 64, 2);
        uint8_t topic_len = rec[66], tag_len = rec[67];
        uint64_t sections = (uint64_t)HEADER_SIZE + topic_len + tag_len + keys_len + props_len +
                            body_len;
        if (physical != file_start + at || sections != total || (flags & ~FLAGS_KNOWN)) {
            status = SCAN_INVALID;
            break;
        }
        const uint8_t *topic = rec + HEADER_SIZE;
        int text_ok = 1;
        for (uint8_t k = 0; k < topic_len; k++)
            if (topic[k] >= 0x80) text_ok = 0;
        if (!text_ok || !valid_utf8(topic + topic_len, tag_len)) {
            status = SCAN_INVALID;
            break;
        }
        uint64_t topic_hash = topic_memo_hash(&memo, topic, topic_len);
        int32_t queue_id;
        memcpy(&queue_id, rec + AT_QUEUE_ID, 4);
        if (rows == NULL) {
            pos_out[count] = at;
            size_out[count] = (int32_t)total;
            memcpy(&qoff_out[count], rec + AT_QUEUE_OFFSET, 8);
            qid_out[count] = queue_id;
            memcpy(&ts_out[count], rec + AT_STORE_TS, 8);
            tlen_out[count] = topic_len;
            thash_out[count] = topic_hash;
        } else { /* dispatch_columns' row per field, instead (one set of write streams) */
            rows[DISPATCH_PHYSICAL * width + count] = physical;
            rows[DISPATCH_SIZE * width + count] = total;
            memcpy(&rows[DISPATCH_QUEUE_OFFSET * width + count], rec + AT_QUEUE_OFFSET, 8);
            rows[DISPATCH_QUEUE_ID * width + count] = queue_id;
            memcpy(&rows[DISPATCH_BORN_TS * width + count], rec + AT_BORN_TS, 8);
            memcpy(&rows[DISPATCH_STORE_TS * width + count], rec + AT_STORE_TS, 8);
            memcpy(&rows[DISPATCH_TOPIC_HASH * width + count], &topic_hash, 8);
            rows[DISPATCH_TOPIC_LEN * width + count] = topic_len;
            rows[DISPATCH_TAG_LEN * width + count] = tag_len;
            rows[DISPATCH_KEYS_LEN * width + count] = keys_len;
            rows[DISPATCH_FLAGS * width + count] = flags;
        }
        count++;
        if (!(flags & FLAG_GROUP_OPEN)) closed = count;
        at += total;
    }
    Py_END_ALLOW_THREADS
    result = Py_BuildValue("(Lnin)", (long long)at, count, status, closed);
done:
    while (got-- > 0) PyBuffer_Release(&views[got]);
    return result;
}

/* ------------------------------------------------------------------ verify_records() */

/* verify_records(buffer, positions, sizes) -> index of the first record (at
 * positions[i] inside buffer, sizes[i] bytes; int64 arrays) whose size field, magic or
 * checksum is wrong, or -1 when all verify. Runs without the GIL. */
PyObject *mqstore_verify_records(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "verify_records(buffer, positions, sizes)");
        return NULL;
    }
    Py_buffer buf, pos, sizes;
    if (PyObject_GetBuffer(args[0], &buf, PyBUF_SIMPLE) < 0) return NULL;
    if (get_array(args[1], &pos, 8, 0, "positions") < 0) {
        PyBuffer_Release(&buf);
        return NULL;
    }
    if (get_array(args[2], &sizes, 8, 0, "sizes") < 0) {
        PyBuffer_Release(&pos);
        PyBuffer_Release(&buf);
        return NULL;
    }
    Py_ssize_t count = pos.len / 8;
    Py_ssize_t bad = -1;
    if (sizes.len != pos.len) {
        PyErr_SetString(PyExc_ValueError, "positions and sizes differ in length");
    } else {
        const int64_t *p = pos.buf, *s = sizes.buf;
        const uint8_t *base = buf.buf;
        Py_ssize_t len = buf.len;
        Py_BEGIN_ALLOW_THREADS for (Py_ssize_t i = 0; i < count; i++) {
            /* Both come from ConsumeQueue units, that is from disk: never trusted. */
            int64_t at = p[i], size = s[i];
            if (size < HEADER_SIZE || !slice_inside(at, size, len)) {
                bad = i;
                break;
            }
            const uint8_t *rec = base + at;
            if ((int64_t)read32(rec) != size || read32(rec + 4) != MESSAGE_MAGIC) {
                bad = i;
                break;
            }
            uint64_t seed = (uint64_t)size | ((uint64_t)MESSAGE_MAGIC << 32);
            if (xxh64(rec + BLANK_SIZE, (size_t)size - BLANK_SIZE, seed) != read64(rec + 8)) {
                bad = i;
                break;
            }
        }
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&sizes);
    PyBuffer_Release(&pos);
    PyBuffer_Release(&buf);
    if (PyErr_Occurred()) return NULL;
    return PyLong_FromSsize_t(bad);
}

/* ------------------------------------------------------------------ gather() */

/* gather(buffer, starts, lengths, out) copies buffer[starts[i]:starts[i]+lengths[i]]
 * one after another into out (a writable buffer of sum(lengths) bytes; int64 arrays).
 * Runs without the GIL. */
PyObject *mqstore_gather(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "gather(buffer, starts, lengths, out)");
        return NULL;
    }
    Py_buffer buf, starts, lengths, out;
    if (PyObject_GetBuffer(args[0], &buf, PyBUF_SIMPLE) < 0) return NULL;
    if (get_array(args[1], &starts, 8, 0, "starts") < 0) {
        PyBuffer_Release(&buf);
        return NULL;
    }
    if (get_array(args[2], &lengths, 8, 0, "lengths") < 0) {
        PyBuffer_Release(&starts);
        PyBuffer_Release(&buf);
        return NULL;
    }
    if (PyObject_GetBuffer(args[3], &out, PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&lengths);
        PyBuffer_Release(&starts);
        PyBuffer_Release(&buf);
        return NULL;
    }
    int ok = starts.len == lengths.len;
    Py_ssize_t count = starts.len / 8;
    const int64_t *st = starts.buf, *ln = lengths.buf;
    int64_t room = out.len; /* what out has left: the sum of lengths is never formed */
    for (Py_ssize_t i = 0; ok && i < count; i++) {
        if (!slice_inside(st[i], ln[i], buf.len) || ln[i] > room) ok = 0;
        else room -= ln[i];
    }
    if (!ok) {
        PyErr_SetString(PyExc_ValueError, "a slice lies outside the buffer, or out is short");
    } else {
        uint8_t *dst = out.buf;
        const uint8_t *base = buf.buf;
        Py_BEGIN_ALLOW_THREADS for (Py_ssize_t i = 0; i < count; i++) {
            memcpy(dst, base + st[i], (size_t)ln[i]);
            dst += ln[i];
        }
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&out);
    PyBuffer_Release(&lengths);
    PyBuffer_Release(&starts);
    PyBuffer_Release(&buf);
    if (PyErr_Occurred()) return NULL;
    Py_RETURN_NONE;
}
