/*
 * commitlog._native, part three: the dispatcher's header scan.
 *
 * dispatch_columns walks the records of one CommitLog file from a record boundary and
 * writes, per record, what the ConsumeQueues and the index need (physical offset,
 * size, queue offset, queue id, born and store timestamps, topic hash and length,
 * tag and keys lengths, flags) into the rows of one int64 array, in one call per run of
 * records: the dispatcher then groups them per queue with numpy and writes each
 * queue's units in bulk, instead of unpacking every header in Python.
 * commitlog/header_scan.py declares the contract and holds the pure-Python twin;
 * tests/commitlog/test_header_scan.py compares them and fuzzes this one.
 *
 * Every record is checked as far as reading its header and topic needs (size, magic,
 * sections adding up to the size, physical offset, known flags, an ASCII topic), and
 * with verify also as record.decode does (checksum, UTF-8 tag). Runs without the GIL.
 */
#include "_native.h"

#include <sys/mman.h>
#include <unistd.h>
#if defined(__linux__) && !defined(MADV_POPULATE_READ)
#define MADV_POPULATE_READ 22 /* linux/mman.h, 5.14+; older C libraries lack the name */
#endif

/* dispatch_columns(buffer, start, stop, file_size, hard_end, file_start, verify, out)
 *     -> (end, count, status)
 * buffer: the file's bytes (file_size <= len); start: a record boundary in the file;
 * records that start before stop are taken whole; hard_end: the in-file position no
 * record may pass (the written end; may lie past the file); file_start: the file's
 * physical offset. out: int64, DISPATCH_ROWS rows of one capacity (C order). */
PyObject *mqstore_dispatch_columns(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "dispatch_columns takes 8 arguments");
        return NULL;
    }
    int64_t start, stop, file_size, hard_end, file_start;
    if (as_i64(args[1], &start) < 0 || as_i64(args[2], &stop) < 0 ||
        as_i64(args[3], &file_size) < 0 || as_i64(args[4], &hard_end) < 0 ||
        as_i64(args[5], &file_start) < 0)
        return NULL;
    int verify = PyObject_IsTrue(args[6]);
    if (verify < 0) return NULL;
    Py_buffer buffer, out;
    if (PyObject_GetBuffer(args[0], &buffer, PyBUF_SIMPLE) < 0) return NULL;
    if (get_array(args[7], &out, 8, 1, "out") < 0) {
        PyBuffer_Release(&buffer);
        return NULL;
    }
    PyObject *result = NULL;
    Py_ssize_t capacity = out.len / 8 / DISPATCH_ROWS;
    /* 0 <= start <= stop <= file_size <= len, hard_end >= 0, and file_start + file_size
     * does not wrap: every sum below (at + total, file_start + at) is then exact. */
    if (out.len != capacity * 8 * DISPATCH_ROWS || start < 0 || start > stop ||
        stop > file_size || file_size > buffer.len || hard_end < 0 || file_start < 0 ||
        file_start > INT64_MAX - file_size) {
        PyErr_SetString(PyExc_ValueError, "dispatch_columns: bad range, start or out shape");
        goto done;
    }
    const uint8_t *base = buffer.buf;
    int64_t *rows = out.buf;
    int64_t *physical_out = rows + DISPATCH_PHYSICAL * capacity;
    int64_t *size_out = rows + DISPATCH_SIZE * capacity;
    int64_t *qoff_out = rows + DISPATCH_QUEUE_OFFSET * capacity;
    int64_t *qid_out = rows + DISPATCH_QUEUE_ID * capacity;
    int64_t *born_out = rows + DISPATCH_BORN_TS * capacity;
    int64_t *stored_out = rows + DISPATCH_STORE_TS * capacity;
    int64_t *thash_out = rows + DISPATCH_TOPIC_HASH * capacity;
    int64_t *tlen_out = rows + DISPATCH_TOPIC_LEN * capacity;
    int64_t *taglen_out = rows + DISPATCH_TAG_LEN * capacity;
    int64_t *keyslen_out = rows + DISPATCH_KEYS_LEN * capacity;
    int64_t *flags_out = rows + DISPATCH_FLAGS * capacity;
    /* A message ends by the hard end and leaves room for a blank record in its file. */
    int64_t fit = file_size - BLANK_SIZE < hard_end ? file_size - BLANK_SIZE : hard_end;
    int64_t at = start;
    Py_ssize_t count = 0;
    int status = DISPATCH_STOP;
    TopicMemo memo;
    topic_memo_init(&memo);
    Py_BEGIN_ALLOW_THREADS
    while (at < stop) {
        if (count == capacity) {
            status = DISPATCH_FULL;
            break;
        }
        if (file_size - at < BLANK_SIZE) { /* no record can start here */
            status = DISPATCH_INVALID;
            break;
        }
        const uint8_t *rec = base + at;
        uint32_t total = read32(rec), magic = read32(rec + AT_MAGIC);
        if (magic == BLANK_MAGIC) {
            uint64_t seed = (uint64_t)total | ((uint64_t)BLANK_MAGIC << 32);
            if ((int64_t)total != file_size - at || file_size > hard_end ||
                (verify && xxh64(rec, 0, seed) != read64(rec + AT_CHECKSUM))) {
                status = DISPATCH_INVALID;
            } else {
                status = DISPATCH_BLANK;
                at = file_size;
            }
            break;
        }
        if (magic != MESSAGE_MAGIC || total < HEADER_SIZE || fit - at < (int64_t)total) {
            status = DISPATCH_INVALID;
            break;
        }
        int64_t physical;
        memcpy(&physical, rec + AT_PHYSICAL_OFFSET, 8);
        uint32_t flags = read32(rec + AT_FLAGS), body_len = read32(rec + AT_BODY_LEN),
                 props_len = read32(rec + AT_PROPERTIES_LEN);
        uint16_t keys_len;
        memcpy(&keys_len, rec + AT_KEYS_LEN, 2);
        uint8_t topic_len = rec[AT_TOPIC_LEN], tag_len = rec[AT_TAG_LEN];
        uint64_t sections = (uint64_t)HEADER_SIZE + topic_len + tag_len + keys_len + props_len +
                            body_len;
        if (physical != file_start + at || sections != total || (flags & ~FLAGS_KNOWN) ||
            topic_len == 0) {
            status = DISPATCH_INVALID;
            break;
        }
        const uint8_t *topic = rec + HEADER_SIZE;
        int text_ok = 1;
        for (uint8_t k = 0; k < topic_len; k++)
            if (topic[k] >= 0x80) text_ok = 0;
        if (!text_ok) {
            status = DISPATCH_INVALID;
            break;
        }
        if (verify) {
            uint64_t seed = (uint64_t)total | ((uint64_t)MESSAGE_MAGIC << 32);
            if (xxh64(rec + BLANK_SIZE, total - BLANK_SIZE, seed) != read64(rec + AT_CHECKSUM) ||
                !valid_utf8(topic + topic_len, tag_len)) {
                status = DISPATCH_INVALID;
                break;
            }
        }
        int32_t queue_id;
        memcpy(&queue_id, rec + AT_QUEUE_ID, 4);
        physical_out[count] = physical;
        size_out[count] = total;
        memcpy(&qoff_out[count], rec + AT_QUEUE_OFFSET, 8);
        qid_out[count] = queue_id;
        memcpy(&born_out[count], rec + AT_BORN_TS, 8);
        memcpy(&stored_out[count], rec + AT_STORE_TS, 8);
        uint64_t topic_hash = topic_memo_hash(&memo, topic, topic_len);
        memcpy(&thash_out[count], &topic_hash, 8); /* the same 64 bits, signed */
        tlen_out[count] = topic_len;
        taglen_out[count] = tag_len;
        keyslen_out[count] = keys_len;
        flags_out[count] = flags;
        count++;
        at += total;
    }
    Py_END_ALLOW_THREADS
    result = Py_BuildValue("(Lni)", (long long)at, count, status);
done:
    PyBuffer_Release(&out);
    PyBuffer_Release(&buffer);
    return result;
}

/* units_in_place(units, times, block_max, interval, unit_in_file, first_offset,
 *                queue_offsets, physical, sizes, tags, timestamps, order, lo, count) -> n
 * The re-dispatch's check of units a queue's file holds already (consumequeue/
 * reput_check.py declares the contract and holds the pure-Python twin). Unit i of
 * [0, count) is row r = order[lo + i] (r = lo + i when order is None) of a run's
 * columns; it is in place when its queue offset is first_offset + i, its values are in
 * range, the file's unit unit_in_file + i holds its physical offset, size and tag hash
 * (tags None: 0), the time file its timestamp, and the unit's block maximum is at least
 * that timestamp. Returns how many leading units are in place. units: the unit file's
 * bytes (20-byte units); times, block_max: int64. Runs without the GIL. */
PyObject *mqstore_units_in_place(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 14) {
        PyErr_SetString(PyExc_TypeError, "units_in_place takes 14 arguments");
        return NULL;
    }
    int64_t interval, unit_in_file, first_offset, lo, count;
    if (as_i64(args[3], &interval) < 0 || as_i64(args[4], &unit_in_file) < 0 ||
        as_i64(args[5], &first_offset) < 0 || as_i64(args[12], &lo) < 0 ||
        as_i64(args[13], &count) < 0)
        return NULL;
    /* views: units, times, block_max, queue_offsets, physical, sizes, timestamps,
     * tags (optional), order (optional) */
    Py_buffer views[9];
    int taken[9] = {0};
    PyObject *result = NULL;
    if (PyObject_GetBuffer(args[0], &views[0], PyBUF_SIMPLE) < 0) return NULL;
    taken[0] = 1;
    PyObject *const arrays[8] = {args[1], args[2], args[6], args[7], args[8], args[10], args[9],
                                 args[11]};
    static const char *const names[8] = {"times",  "block_max",  "queue_offsets", "physical",
                                         "sizes",  "timestamps", "tags",          "order"};
    for (int k = 0; k < 8; k++) {
        if (k >= 6 && arrays[k] == Py_None) continue;
        if (get_array(arrays[k], &views[k + 1], 8, 0, names[k]) < 0) goto done;
        taken[k + 1] = 1;
    }
    Py_ssize_t units_len = views[0].len / UNIT_SIZE, times_len = views[1].len / 8,
               maxima_len = views[2].len / 8, rows_len = views[4].len / 8;
    int rows_short = views[3].len / 8 < rows_len || views[5].len / 8 < rows_len ||
                     views[6].len / 8 < rows_len || (taken[7] && views[7].len / 8 < rows_len);
    Py_ssize_t picks_len = taken[8] ? views[8].len / 8 : rows_len;
    /* Every index below is checked against its array: unit_in_file + i < units_len and
     * times_len, (unit_in_file + i) / interval < maxima_len, lo + i < picks_len, and a
     * row from order against rows_len, before it is read. */
    if (rows_short || interval <= 0 || unit_in_file < 0 || first_offset < 0 || lo < 0 ||
        count < 0 || lo > picks_len || count > picks_len - lo || unit_in_file > units_len ||
        count > units_len - unit_in_file || unit_in_file > times_len ||
        count > times_len - unit_in_file || first_offset > INT64_MAX - count) {
        PyErr_SetString(PyExc_ValueError, "units_in_place: bad range or short arrays");
        goto done;
    }
    const uint8_t *units = views[0].buf;
    const int64_t *times = views[1].buf, *maxima = views[2].buf, *qoffs = views[3].buf,
                  *physical = views[4].buf, *sizes = views[5].buf, *stamps = views[6].buf;
    const int64_t *tags = taken[7] ? views[7].buf : NULL, *order = taken[8] ? views[8].buf : NULL;
    int64_t in_place = 0, bad_row = 0;
    Py_BEGIN_ALLOW_THREADS
    for (; in_place < count; in_place++) {
        int64_t row = order != NULL ? order[lo + in_place] : lo + in_place;
        if (row < 0 || row >= rows_len) {
            bad_row = 1;
            break;
        }
        int64_t unit = unit_in_file + in_place, block = unit / interval;
        int64_t size = sizes[row], stamp = stamps[row], tag = tags != NULL ? tags[row] : 0;
        if (qoffs[row] != first_offset + in_place || physical[row] < 0 || size < 1 ||
            size > INT32_MAX || stamp < 0 || block >= maxima_len)
            break;
        const uint8_t *stored = units + unit * UNIT_SIZE;
        int64_t stored_physical, stored_tag;
        int32_t stored_size;
        memcpy(&stored_physical, stored + UNIT_AT_COMMITLOG_OFFSET, 8);
        memcpy(&stored_size, stored + UNIT_AT_SIZE, 4);
        memcpy(&stored_tag, stored + UNIT_AT_TAG_HASH, 8);
        if (stored_physical != physical[row] || stored_size != size || stored_tag != tag ||
            times[unit] != stamp || maxima[block] < stamp)
            break;
    }
    Py_END_ALLOW_THREADS
    if (bad_row)
        PyErr_SetString(PyExc_ValueError, "units_in_place: a row of order is out of range");
    else
        result = PyLong_FromLongLong(in_place);
done:
    for (int k = 0; k < 9; k++)
        if (taken[k]) PyBuffer_Release(&views[k]);
    return result;
}

/* run_stretches(rows, count, starts) -> (stretches, store_ts_max, tagged, keyed,
 *                                        first_empty_topic)
 * One pass over a run's dispatch columns (the first count of rows, an int64 array of
 * DISPATCH_ROWS rows, C order) for what grouping it needs (dispatch/run_stretches.py
 * declares the contract and holds the twin): starts[k] is the row where the k-th
 * stretch of one (topic hash, queue id) starts (row 0 starts the first); then the
 * largest store timestamp, whether any record has a tag, whether any has keys, and the
 * first row whose topic is empty (count: none). 1 <= count <= the rows' width and
 * starts' length. Runs without the GIL. */
PyObject *mqstore_run_stretches(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "run_stretches takes 3 arguments");
        return NULL;
    }
    int64_t count;
    if (as_i64(args[1], &count) < 0) return NULL;
    Py_buffer rows_view, starts_view;
    if (get_array(args[0], &rows_view, 8, 0, "rows") < 0) return NULL;
    if (get_array(args[2], &starts_view, 8, 1, "starts") < 0) {
        PyBuffer_Release(&rows_view);
        return NULL;
    }
    PyObject *result = NULL;
    Py_ssize_t width = rows_view.len / 8 / DISPATCH_ROWS;
    if (rows_view.len != width * 8 * DISPATCH_ROWS || count < 1 || count > width ||
        count > starts_view.len / 8) {
        PyErr_SetString(PyExc_ValueError, "run_stretches: bad count or short arrays");
        goto done;
    }
    const int64_t *rows = rows_view.buf;
    const int64_t *hashes = rows + DISPATCH_TOPIC_HASH * width,
                  *queue_ids = rows + DISPATCH_QUEUE_ID * width,
                  *stamps = rows + DISPATCH_STORE_TS * width,
                  *tag_lens = rows + DISPATCH_TAG_LEN * width,
                  *keys_lens = rows + DISPATCH_KEYS_LEN * width,
                  *topic_lens = rows + DISPATCH_TOPIC_LEN * width;
    int64_t *starts = starts_view.buf;
    int64_t stretches = 0, stamp_max = INT64_MIN, tagged = 0, keyed = 0, empty_topic = count;
    Py_BEGIN_ALLOW_THREADS
    for (int64_t row = 0; row < count; row++) {
        if (row == 0 || hashes[row] != hashes[row - 1] || queue_ids[row] != queue_ids[row - 1])
            starts[stretches++] = row;
        if (stamps[row] > stamp_max) stamp_max = stamps[row];
        tagged |= tag_lens[row] != 0;
        keyed |= keys_lens[row] != 0;
        if (topic_lens[row] == 0 && empty_topic == count) empty_topic = row;
    }
    Py_END_ALLOW_THREADS
    result = Py_BuildValue("(LLOOL)", (long long)stretches, (long long)stamp_max,
                           tagged ? Py_True : Py_False, keyed ? Py_True : Py_False,
                           (long long)empty_topic);
done:
    PyBuffer_Release(&starts_view);
    PyBuffer_Release(&rows_view);
    return result;
}

/* populate_read(buffer, start, length) -> bool
 * Map [start, start + length) of buffer, a page-aligned mapping (a CommitLog file's),
 * from start rounded down to a page, ahead of a scan: madvise(MADV_POPULATE_READ),
 * without the GIL (it takes milliseconds for a window). commitlog/recovery.py's
 * _populate says why; populate_read_py there is the twin. A hint: False (nothing done)
 * when the buffer is not page-aligned, the kernel lacks it, or it fails; ValueError
 * for a range outside the buffer. */
PyObject *mqstore_populate_read(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "populate_read takes 3 arguments");
        return NULL;
    }
    int64_t start, length;
    if (as_i64(args[1], &start) < 0 || as_i64(args[2], &length) < 0) return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) return NULL;
    PyObject *result = NULL;
    if (!slice_inside(start, length, view.len)) {
        PyErr_SetString(PyExc_ValueError, "populate_read: range outside the buffer");
        goto done;
    }
    int done_it = 0;
#if defined(__linux__)
    long page = sysconf(_SC_PAGESIZE);
    uintptr_t base = (uintptr_t)view.buf;
    if (page > 0 && base % (uintptr_t)page == 0 && length > 0) {
        int64_t from = start - start % page; /* stays inside: the buffer starts on a page */
        int rc;
        Py_BEGIN_ALLOW_THREADS
        rc = madvise((char *)view.buf + from, (size_t)(start + length - from), MADV_POPULATE_READ);
        Py_END_ALLOW_THREADS
        done_it = rc == 0;
    }
#endif
    result = PyBool_FromLong(done_it);
done:
    PyBuffer_Release(&view);
    return result;
}
