/*
 * commitlog._native: the hot loops of the record format, in C.
 *
 * The format itself is declared once, in commitlog/record_format.py; this file
 * follows it, and commitlog/record.py holds the pure-Python version of every function
 * here (the fallback when this module did not build, and the reference the tests
 * compare it with). Nothing here allocates Python objects per record: the callers pass buffers
 * and numpy arrays, and get counts or positions back. The record layout, XXH64 and
 * the helpers live in _native.h; the checks of written records (scan_records,
 * verify_records, gather) in _scan.c; the columnar read (read_columns, slices, rows
 * and the type Row, tuples) in _columns.c.
 */
#include "_native.h"
#include <structmember.h>
#include <time.h>

/* Whether the sections fit their length fields and add up to total (a ValueError
 * when not). Each length is a Py_ssize_t of a buffer, so their sum cannot wrap. */
static int sections_fit(const Py_buffer *topic, const Py_buffer *tag, const Py_buffer *keys,
                        const Py_buffer *props, const Py_buffer *body, int64_t total) {
    if (topic->len > 255 || tag->len > 255 || keys->len > 0xFFFF || props->len > 0xFFFFFFFFLL ||
        body->len > 0xFFFFFFFFLL || total > RECORD_SIZE_MAX ||
        HEADER_SIZE + topic->len + tag->len + keys->len + props->len + body->len != total) {
        PyErr_SetString(PyExc_ValueError, "section lengths do not add up to total_size");
        return 0;
    }
    return 1;
}

/* Write one record at dst (which has room for total bytes); returns nothing: the
 * caller checked every length. */
void write_record(uint8_t *dst, uint32_t total, int64_t queue_offset, int64_t physical,
                         int64_t born, int64_t stored, int32_t queue_id, uint32_t flags,
                         const Py_buffer *topic, const Py_buffer *tag, const Py_buffer *keys,
                         const Py_buffer *props, const Py_buffer *body) {
    put_u32(dst, total);
    put_u32(dst + 4, MESSAGE_MAGIC);
    put_u64(dst + 16, (uint64_t)queue_offset);
    put_u64(dst + 24, (uint64_t)physical);
    put_u64(dst + 32, (uint64_t)born);
    put_u64(dst + 40, (uint64_t)stored);
    put_u32(dst + 48, (uint32_t)queue_id);
    put_u32(dst + 52, flags);
    put_u32(dst + 56, (uint32_t)body->len);
    put_u32(dst + 60, (uint32_t)props->len);
    put_u16(dst + 64, (uint16_t)keys->len);
    dst[66] = (uint8_t)topic->len;
    dst[67] = (uint8_t)tag->len;
    uint8_t *cursor = dst + HEADER_SIZE;
    memcpy(cursor, topic->buf, topic->len);
    cursor += topic->len;
    if (tag->len) memcpy(cursor, tag->buf, tag->len);
    cursor += tag->len;
    if (keys->len) memcpy(cursor, keys->buf, keys->len);
    cursor += keys->len;
    if (props->len) memcpy(cursor, props->buf, props->len);
    cursor += props->len;
    if (body->len) memcpy(cursor, body->buf, body->len);
    uint64_t seed = (uint64_t)total | ((uint64_t)MESSAGE_MAGIC << 32);
    put_u64(dst + 8, xxh64(dst + BLANK_SIZE, total - BLANK_SIZE, seed));
}

/* Where a batch encoder is in the current file: the shared "does it fit, write it,
 * note its position, move on" of encode_run, encode_bodies and encode_slices. */
typedef struct {
    uint8_t *out;
    int64_t in_file, file_size, physical, queue_offset, stored;
    int32_t queue_id;
    int64_t *positions;
} Run;

/* Check a batch encoder's place (a ValueError when out of range): 0 <= start <= count,
 * positions has count slots, 0 <= in_file <= file_size <= out_len, and physical and
 * queue offsets that cannot wrap however many records the rest of the file takes (so
 * run_put's sums never overflow). */
static int run_check(const Run *run, Py_ssize_t out_len, Py_ssize_t positions_len,
                     Py_ssize_t count, int64_t start, int64_t queue_id) {
    const char *why = NULL;
    if (start < 0 || start > count || positions_len / 8 < count)
        why = "start or positions do not match the batch";
    else if (run->in_file < 0 || run->in_file > run->file_size || run->file_size > out_len)
        why = "in_file and file_size must satisfy 0 <= in_file <= file_size <= len(buffer)";
    else if (run->physical < 0 || run->physical > INT64_MAX - (run->file_size - run->in_file))
        why = "physical offset out of range";
    else if (run->queue_offset < 0 || run->queue_offset > INT64_MAX - count)
        why = "queue offset out of range";
    else if (queue_id < INT32_MIN || queue_id > INT32_MAX)
        why = "queue_id out of range";
    if (why != NULL) PyErr_SetString(PyExc_ValueError, why);
    return why == NULL;
}

/* Whether a record of size bytes (HEADER_SIZE..RECORD_SIZE_MAX) fits before the file's
 * end with room kept for a blank; no sum can wrap (in_file <= file_size, checked). */
static inline int run_fits(const Run *run, int64_t size) {
    return size <= run->file_size - run->in_file - BLANK_SIZE;
}

/* Write record index (run_fits was true) and advance past it. */
static inline void run_put(Run *run, Py_ssize_t index, int64_t size, int64_t born,
                           uint32_t flags, const Py_buffer *topic, const Py_buffer *tag,
                           const Py_buffer *keys, const Py_buffer *props, const Py_buffer *body) {
    write_record(run->out + run->in_file, (uint32_t)size, run->queue_offset, run->physical, born,
                 run->stored, run->queue_id, flags, topic, tag, keys, props, body);
    run->positions[index] = run->physical;
    run->physical += size;
    run->in_file += size;
    run->queue_offset++;
}

/* encode_run's work on one item of encoded (a 7-tuple; see below): 1 when written, 0
 * when it does not fit the file, -1 with an exception when the item is wrong. */
static int run_put_item(Run *run, Py_ssize_t index, PyObject *item, const Py_buffer *topic) {
    if (!PyTuple_CheckExact(item) || PyTuple_GET_SIZE(item) != 7) {
        PyErr_SetString(PyExc_TypeError, "encoded items are 7-tuples");
        return -1;
    }
    int64_t size, flags, born = run->stored;
    if (as_i64(PyTuple_GET_ITEM(item, 0), &size) < 0 ||
        as_i64(PyTuple_GET_ITEM(item, 1), &flags) < 0)
        return -1;
    if (size < HEADER_SIZE || size > RECORD_SIZE_MAX || flags < 0 || flags > UINT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "an encoded item's size or flags is out of range");
        return -1;
    }
    if (!run_fits(run, size)) return 0;
    PyObject *born_obj = PyTuple_GET_ITEM(item, 6);
    if (born_obj != Py_None && as_i64(born_obj, &born) < 0) return -1;
    Py_buffer tag, keys, props, body;
    tag.obj = keys.obj = props.obj = body.obj = NULL;
    int bad = get_bytes(PyTuple_GET_ITEM(item, 2), &tag, "tag") < 0 ||
              get_bytes(PyTuple_GET_ITEM(item, 3), &keys, "keys") < 0 ||
              get_bytes(PyTuple_GET_ITEM(item, 4), &props, "properties") < 0 ||
              get_bytes(PyTuple_GET_ITEM(item, 5), &body, "body") < 0 ||
              !sections_fit(topic, &tag, &keys, &props, &body, size);
    if (!bad) run_put(run, index, size, born, (uint32_t)flags, topic, &tag, &keys, &props, &body);
    release(&body);
    release(&props);
    release(&keys);
    release(&tag);
    return bad ? -1 : 1;
}

/* ------------------------------------------------------------------ xxh64() */

static PyObject *py_xxh64(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "xxh64(data, seed)");
        return NULL;
    }
    unsigned long long seed = PyLong_AsUnsignedLongLongMask(args[1]);
    if (seed == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    Py_buffer view;
    if (get_bytes(args[0], &view, "data") < 0) return NULL;
    uint64_t h;
    if (view.len >= 4096) {
        Py_BEGIN_ALLOW_THREADS h = xxh64(view.buf, (size_t)view.len, seed);
        Py_END_ALLOW_THREADS
    } else {
        h = xxh64(view.buf, (size_t)view.len, seed);
    }
    release(&view);
    return PyLong_FromUnsignedLongLong(h);
}

/* ------------------------------------------------------------------ encode_into() */

/* encode_into(buffer, position, physical_offset, total_size, queue_offset, born_ts_ms,
 *             store_ts_ms, queue_id, flags, topic, tag, keys, properties, body)
 * The signature of record.encode_into: the caller validated every field and computed
 * total_size; this checks that the sections add up and fit the buffer. */
static PyObject *py_encode_into(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 14) {
        PyErr_SetString(PyExc_TypeError, "encode_into takes 14 arguments");
        return NULL;
    }
    int64_t position, physical, total, queue_offset, born, stored, queue_id, flags;
    if (as_i64(args[1], &position) < 0 || as_i64(args[2], &physical) < 0 ||
        as_i64(args[3], &total) < 0 || as_i64(args[4], &queue_offset) < 0 ||
        as_i64(args[5], &born) < 0 || as_i64(args[6], &stored) < 0 ||
        as_i64(args[7], &queue_id) < 0 || as_i64(args[8], &flags) < 0)
        return NULL;
    Py_buffer out, topic, tag, keys, props, body;
    if (PyObject_GetBuffer(args[0], &out, PyBUF_WRITABLE) < 0) return NULL;
    topic.obj = tag.obj = keys.obj = props.obj = body.obj = NULL;
    PyObject *result = NULL;
    if (get_bytes(args[9], &topic, "topic") < 0) goto done;
    if (get_bytes(args[10], &tag, "tag") < 0) goto done;
    if (get_bytes(args[11], &keys, "keys") < 0) goto done;
    if (get_bytes(args[12], &props, "properties") < 0) goto done;
    if (get_bytes(args[13], &body, "body") < 0) goto done;
    if (!sections_fit(&topic, &tag, &keys, &props, &body, total)) goto done;
    if (queue_id < INT32_MIN || queue_id > INT32_MAX || flags < 0 || flags > UINT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "queue_id or flags out of range");
        goto done;
    }
    if (!slice_inside(position, total, out.len)) {
        PyErr_SetString(PyExc_ValueError, "the record does not fit the buffer");
        goto done;
    }
    write_record((uint8_t *)out.buf + position, (uint32_t)total, queue_offset, physical, born,
                 stored, (int32_t)queue_id, (uint32_t)flags, &topic, &tag, &keys, &props, &body);
    result = Py_None;
    Py_INCREF(result);
done:
    release(&body);
    release(&props);
    release(&keys);
    release(&tag);
    release(&topic);
    PyBuffer_Release(&out);
    return result;
}

/* ------------------------------------------------------------------ encode_run() */

/* encode_run(buffer, in_file, file_size, physical, first_queue_offset, store_ts_ms,
 *            queue_id, topic, encoded, start, positions)
 *
 * Write encoded[start:] (record.py's per-record tuples (size, flags, tag, keys,
 * properties, body, born_ts_ms or None)) one after another from in_file, while each
 * record leaves room for a blank record before file_size. positions (an int64 array
 * with one slot per item of encoded) gets every written record's physical offset.
 * Returns the index after the last written item: len(encoded) when all fit, else the
 * item the caller must roll the file for. */
static PyObject *py_encode_run(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 11) {
        PyErr_SetString(PyExc_TypeError, "encode_run takes 11 arguments");
        return NULL;
    }
    int64_t in_file, file_size, physical, queue_offset, stored, queue_id, start;
    if (as_i64(args[1], &in_file) < 0 || as_i64(args[2], &file_size) < 0 ||
        as_i64(args[3], &physical) < 0 || as_i64(args[4], &queue_offset) < 0 ||
        as_i64(args[5], &stored) < 0 || as_i64(args[6], &queue_id) < 0 ||
        as_i64(args[9], &start) < 0)
        return NULL;
    PyObject *encoded = args[8];
    if (!PyList_CheckExact(encoded)) {
        PyErr_SetString(PyExc_TypeError, "encoded must be a list");
        return NULL;
    }
    Py_ssize_t count = PyList_GET_SIZE(encoded);
    Py_buffer out, topic, positions;
    if (PyObject_GetBuffer(args[0], &out, PyBUF_WRITABLE) < 0) return NULL;
    if (get_bytes(args[7], &topic, "topic") < 0) {
        PyBuffer_Release(&out);
        return NULL;
    }
    if (get_array(args[10], &positions, 8, 1, "positions") < 0) {
        release(&topic);
        PyBuffer_Release(&out);
        return NULL;
    }
    Run run = {(uint8_t *)out.buf, in_file, file_size, physical, queue_offset, stored,
               (int32_t)queue_id, (int64_t *)positions.buf};
    Py_ssize_t index = (Py_ssize_t)start;
    PyObject *result = NULL;
    if (!run_check(&run, out.len, positions.len, count, start, queue_id)) goto done;
    /* An item's __index__ can change the list: its size is read again every round. */
    for (; index < PyList_GET_SIZE(encoded) && index < count; index++) {
        /* A reference of our own: an item's __index__ could empty the list. */
        PyObject *item = PyList_GET_ITEM(encoded, index);
        Py_INCREF(item);
        int put = run_put_item(&run, index, item, &topic);
        Py_DECREF(item);
        if (put < 0) goto done;
        if (put == 0) break;
    }
    result = PyLong_FromSsize_t(index);
done:
    PyBuffer_Release(&positions);
    release(&topic);
    PyBuffer_Release(&out);
    return result;
}

/* ------------------------------------------------------------------ plain batches */

/* A body's bytes: bytes, bytearray or memoryview (others refused: -2); None is a
 * null body (-1 returned, empty view). */
static int body_view(PyObject *obj, Py_buffer *view) {
    view->obj = NULL;
    if (PyBytes_CheckExact(obj)) {
        view->buf = PyBytes_AS_STRING(obj);
        view->len = PyBytes_GET_SIZE(obj);
        return 0;
    }
    if (obj == Py_None) {
        view->buf = (void *)"";
        view->len = 0;
        return -1;
    }
    if (!PyByteArray_Check(obj) && !PyMemoryView_Check(obj) && !PyBytes_Check(obj)) return -2;
    if (PyObject_GetBuffer(obj, view, PyBUF_SIMPLE) < 0) {
        PyErr_Clear();
        view->obj = NULL;
        return -2;
    }
    return 0;
}

/* check_bodies(bodies, fixed_size, limit, sizes) -> -1, or the index of the first body
 * that is not bytes-like or None, or whose record (fixed_size + len) exceeds limit
 * (or is negative: a fixed_size no caller passes).
 * sizes (int32, one per body) gets every record's total size. */
static PyObject *py_check_bodies(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4 || !PyList_CheckExact(args[0])) {
        PyErr_SetString(PyExc_TypeError, "check_bodies(list, fixed_size, limit, sizes)");
        return NULL;
    }
    int64_t fixed, limit;
    if (as_i64(args[1], &fixed) < 0 || as_i64(args[2], &limit) < 0) return NULL;
    Py_buffer sizes;
    if (get_array(args[3], &sizes, 4, 1, "sizes") < 0) return NULL;
    PyObject *bodies = args[0];
    Py_ssize_t count = PyList_GET_SIZE(bodies), bad = -1;
    if (sizes.len < count * 4) {
        PyBuffer_Release(&sizes);
        PyErr_SetString(PyExc_ValueError, "sizes is too short");
        return NULL;
    }
    int32_t *out = sizes.buf;
    for (Py_ssize_t i = 0; i < count; i++) {
        Py_buffer view;
        int kind = body_view(PyList_GET_ITEM(bodies, i), &view);
        if (kind == -2) {
            bad = i;
            break;
        }
        int wraps = view.len > 0 && fixed > INT64_MAX - view.len; /* then above any limit */
        int64_t total = wraps ? INT64_MAX : fixed + view.len;
        release(&view);
        if (total < 0 || total > limit || total > 0x7FFFFFFF) {
            bad = i;
            break;
        }
        out[i] = (int32_t)total;
    }
    PyBuffer_Release(&sizes);
    return PyLong_FromSsize_t(bad);
}

/* encode_bodies(buffer, in_file, file_size, physical, first_queue_offset, store_ts_ms,
 *               born_ts_ms, queue_id, topic, tag, bodies, start, positions) -> index
 * encode_run for a batch whose records share topic, tag and born timestamp and carry
 * no keys or properties (what check_bodies accepted): bodies[start:] are written
 * while they fit, positions (int64) gets their physical offsets. */
static PyObject *py_encode_bodies(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 13 || !PyList_CheckExact(args[10])) {
        PyErr_SetString(PyExc_TypeError, "encode_bodies takes 13 arguments (bodies a list)");
        return NULL;
    }
    int64_t in_file, file_size, physical, queue_offset, stored, born, queue_id, start;
    if (as_i64(args[1], &in_file) < 0 || as_i64(args[2], &file_size) < 0 ||
        as_i64(args[3], &physical) < 0 || as_i64(args[4], &queue_offset) < 0 ||
        as_i64(args[5], &stored) < 0 || as_i64(args[6], &born) < 0 ||
        as_i64(args[7], &queue_id) < 0 || as_i64(args[11], &start) < 0)
        return NULL;
    PyObject *bodies = args[10];
    Py_ssize_t count = PyList_GET_SIZE(bodies);
    Py_buffer out, topic, tag, positions, empty;
    empty.buf = (void *)"";
    empty.len = 0;
    empty.obj = NULL;
    if (PyObject_GetBuffer(args[0], &out, PyBUF_WRITABLE) < 0) return NULL;
    topic.obj = tag.obj = NULL;
    PyObject *result = NULL;
    int have_positions = 0;
    if (get_bytes(args[8], &topic, "topic") < 0 || get_bytes(args[9], &tag, "tag") < 0) goto done;
    if (get_array(args[12], &positions, 8, 1, "positions") < 0) goto done;
    have_positions = 1;
    Run run = {(uint8_t *)out.buf, in_file, file_size, physical, queue_offset, stored,
               (int32_t)queue_id, (int64_t *)positions.buf};
    if (!run_check(&run, out.len, positions.len, count, start, queue_id)) goto done;
    if (topic.len > 255 || tag.len > 255) {
        PyErr_SetString(PyExc_ValueError, "encode_bodies: topic or tag longer than 255 bytes");
        goto done;
    }
    int64_t fixed = HEADER_SIZE + topic.len + tag.len;
    Py_ssize_t index = start;
    for (; index < count; index++) {
        Py_buffer body;
        int kind = body_view(PyList_GET_ITEM(bodies, index), &body);
        if (kind == -2) {
            PyErr_SetString(PyExc_TypeError, "a body is not bytes-like (check_bodies first)");
            goto done;
        }
        int64_t size = fixed + body.len; /* body.len is a buffer's: this cannot wrap */
        if (size > RECORD_SIZE_MAX) {
            release(&body);
            PyErr_SetString(PyExc_ValueError, "a record is larger than 4 GiB");
            goto done;
        }
        int fits = run_fits(&run, size);
        if (fits)
            run_put(&run, index, size, born, kind == -1 ? FLAG_NULL_BODY : 0u, &topic, &tag,
                    &empty, &empty, &body);
        release(&body);
        if (!fits) break;
    }
    result = PyLong_FromSsize_t(index);
done:
    if (have_positions) PyBuffer_Release(&positions);
    release(&tag);
    release(&topic);
    PyBuffer_Release(&out);
    return result;
}

/* encode_slices(buffer, in_file, file_size, physical, first_queue_offset, store_ts_ms,
 *               born_ts_ms, queue_id, topic, tag, offsets, data, nulls, borns, start,
 *               positions, flags) -> index
 * encode_bodies for bodies given as Arrow does: body i is data[offsets[i]:offsets[i+1]]
 * (int64 offsets, n + 1 of them, checked by the caller), a null body where nulls (a
 * uint8 array, or None) is non-zero; borns (int64, or None for born_ts_ms for all)
 * gives per-record born timestamps; flags (0 or FLAG_GROUP_OPEN) is set on every
 * record. */
static PyObject *py_encode_slices(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 17) {
        PyErr_SetString(PyExc_TypeError, "encode_slices takes 17 arguments");
        return NULL;
    }
    int64_t in_file, file_size, physical, queue_offset, stored, born, queue_id, start, extra;
    if (as_i64(args[1], &in_file) < 0 || as_i64(args[2], &file_size) < 0 ||
        as_i64(args[3], &physical) < 0 || as_i64(args[4], &queue_offset) < 0 ||
        as_i64(args[5], &stored) < 0 || as_i64(args[6], &born) < 0 ||
        as_i64(args[7], &queue_id) < 0 || as_i64(args[14], &start) < 0 ||
        as_i64(args[16], &extra) < 0)
        return NULL;
    if (extra != 0 && extra != FLAG_GROUP_OPEN) {
        PyErr_SetString(PyExc_ValueError, "encode_slices: flags must be 0 or FLAG_GROUP_OPEN");
        return NULL;
    }
    Py_buffer out, topic, tag, offsets, data, nulls, borns, positions, empty;
    empty.buf = (void *)"";
    empty.len = 0;
    empty.obj = NULL;
    topic.obj = tag.obj = offsets.obj = data.obj = nulls.obj = borns.obj = positions.obj = NULL;
    int have_offsets = 0, have_data = 0, have_nulls = 0, have_borns = 0, have_positions = 0;
    PyObject *result = NULL;
    if (PyObject_GetBuffer(args[0], &out, PyBUF_WRITABLE) < 0) return NULL;
    if (get_bytes(args[8], &topic, "topic") < 0 || get_bytes(args[9], &tag, "tag") < 0) goto done;
    if (get_array(args[10], &offsets, 8, 0, "offsets") < 0) goto done;
    have_offsets = 1;
    if (PyObject_GetBuffer(args[11], &data, PyBUF_SIMPLE) < 0) goto done;
    have_data = 1;
    if (args[12] != Py_None) {
        if (get_array(args[12], &nulls, 1, 0, "nulls") < 0) goto done;
        have_nulls = 1;
    }
    if (args[13] != Py_None) {
        if (get_array(args[13], &borns, 8, 0, "borns") < 0) goto done;
        have_borns = 1;
    }
    if (get_array(args[15], &positions, 8, 1, "positions") < 0) goto done;
    have_positions = 1;
    Py_ssize_t count = offsets.len / 8 - 1;
    Run run = {(uint8_t *)out.buf, in_file, file_size, physical, queue_offset, stored,
               (int32_t)queue_id, (int64_t *)positions.buf};
    if (count < 0 || (have_nulls && nulls.len < count) || (have_borns && borns.len < count * 8) ||
        topic.len > 255 || tag.len > 255) {
        PyErr_SetString(PyExc_ValueError, "encode_slices: arrays do not match");
        goto done;
    }
    if (!run_check(&run, out.len, positions.len, count, start, queue_id)) goto done;
    const int64_t *offs = offsets.buf, *born_at = have_borns ? borns.buf : NULL;
    const uint8_t *null_at = have_nulls ? nulls.buf : NULL;
    int64_t fixed = HEADER_SIZE + topic.len + tag.len;
    Py_ssize_t index = start;
    for (; index < count; index++) {
        int64_t from = offs[index], to = offs[index + 1];
        if (from < 0 || to < from || to > data.len) {
            PyErr_SetString(PyExc_ValueError, "encode_slices: an offset is out of range");
            goto done;
        }
        Py_buffer body;
        body.obj = NULL;
        body.buf = (uint8_t *)data.buf + from;
        body.len = to - from;
        int is_null = null_at != NULL && null_at[index];
        if (is_null) body.len = 0;
        int64_t size = fixed + body.len;
        if (size > RECORD_SIZE_MAX) {
            PyErr_SetString(PyExc_ValueError, "a record is larger than 4 GiB");
            goto done;
        }
        if (!run_fits(&run, size)) break;
        run_put(&run, index, size, born_at ? born_at[index] : born,
                (is_null ? FLAG_NULL_BODY : 0u) | (uint32_t)extra, &topic, &tag, &empty, &empty,
                &body);
    }
    result = PyLong_FromSsize_t(index);
done:
    if (have_positions) PyBuffer_Release(&positions);
    if (have_borns) PyBuffer_Release(&borns);
    if (have_nulls) PyBuffer_Release(&nulls);
    if (have_data) PyBuffer_Release(&data);
    if (have_offsets) PyBuffer_Release(&offsets);
    release(&tag);
    release(&topic);
    PyBuffer_Release(&out);
    return result;
}

/* ------------------------------------------------------------------ module */

static PyMethodDef methods[] = {
    {"xxh64", (PyCFunction)(void (*)(void))py_xxh64, METH_FASTCALL,
     "xxh64(data, seed) -> the XXH64 hash of data."},
    {"encode_into", (PyCFunction)(void (*)(void))py_encode_into, METH_FASTCALL,
     "Write one record; the signature of commitlog.record.encode_into."},
    {"encode_run", (PyCFunction)(void (*)(void))py_encode_run, METH_FASTCALL,
     "Write encoded records one after another while they fit the file."},
    {"check_bodies", (PyCFunction)(void (*)(void))py_check_bodies, METH_FASTCALL,
     "Sizes of plain records; the index of the first bad body, or -1."},
    {"encode_bodies", (PyCFunction)(void (*)(void))py_encode_bodies, METH_FASTCALL,
     "encode_run for bodies sharing topic, tag and born timestamp, no keys/properties."},
    {"encode_slices", (PyCFunction)(void (*)(void))py_encode_slices, METH_FASTCALL,
     "encode_bodies for bodies given as Arrow offsets and data."},
    {"scan_records", (PyCFunction)(void (*)(void))mqstore_scan_records, METH_FASTCALL,
     "Walk and verify records from a position; per-record columns and why it stopped."},
    {"verify_records", (PyCFunction)(void (*)(void))mqstore_verify_records, METH_FASTCALL,
     "Index of the first record failing its size, magic or checksum, or -1."},
    {"gather", (PyCFunction)(void (*)(void))mqstore_gather, METH_FASTCALL,
     "Copy byte slices of a buffer one after another into out."},
    {"read_columns", (PyCFunction)(void (*)(void))mqstore_read_columns, METH_FASTCALL,
     "Verify a run of one queue's records and gather them into columns (_columns.c)."},
    {"slices", (PyCFunction)(void (*)(void))mqstore_slices, METH_FASTCALL,
     "Cut a bytes buffer at Arrow offsets into bytes or memoryviews (_columns.c)."},
    {"rows", (PyCFunction)(void (*)(void))mqstore_rows, METH_FASTCALL,
     "The rows of a batch as objects of a Row class, out of the cyclic GC (_columns.c)."},
    {"tuples", (PyCFunction)(void (*)(void))mqstore_tuples, METH_FASTCALL,
     "Rows of a tuple subclass (a NamedTuple) from lists, column by column (_columns.c)."},
    {"untracked_empty_list", (PyCFunction)(void (*)(void))mqstore_untracked_empty_list,
     METH_FASTCALL, "An empty read-only list subclass instance, out of the cyclic GC (_columns.c)."},
    {"untracked_int_array", (PyCFunction)(void (*)(void))mqstore_untracked_int_array,
     METH_FASTCALL, "An array.array subclass instance holding only ints, out of the GC (_columns.c)."},
    {"time_search", (PyCFunction)(void (*)(void))mqstore_time_search, METH_FASTCALL,
     "Where the first running maximum >= T lies: head unit, block, or -1 (_time.c)."},
    {"first_reaching", (PyCFunction)(void (*)(void))mqstore_first_reaching, METH_FASTCALL,
     "The first index in [start, end) of an int64 array whose item >= T, or -1 (_time.c)."},
    {"dispatch_columns", (PyCFunction)(void (*)(void))mqstore_dispatch_columns, METH_FASTCALL,
     "The dispatcher's columns of a run of records in one file (_dispatch.c)."},
    {"units_in_place", (PyCFunction)(void (*)(void))mqstore_units_in_place, METH_FASTCALL,
     "How many leading units of a run a queue file holds already (_dispatch.c)."},
    {"run_stretches", (PyCFunction)(void (*)(void))mqstore_run_stretches, METH_FASTCALL,
     "Stretches of one queue in a run's dispatch columns, and what grouping needs (_dispatch.c)."},
    {"populate_read", (PyCFunction)(void (*)(void))mqstore_populate_read, METH_FASTCALL,
     "Map a range of a page-aligned mapping ahead of a scan, without the GIL (_dispatch.c)."},
    {"record_spans", (PyCFunction)(void (*)(void))mqstore_record_spans, METH_FASTCALL,
     "The records of a Kafka record batch v2: spans of each, checked (_records.c)."},
    {"kafka_batch", (PyCFunction)(void (*)(void))mqstore_kafka_batch, METH_FASTCALL,
     "A Kafka record batch v2 from a read's columns, CRC left 0 (_kafka_codec.c)."},
    {"kafka_values", (PyCFunction)(void (*)(void))mqstore_kafka_values, METH_FASTCALL,
     "A produced batch's records as columns for the columnar put (_kafka_codec.c)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "commitlog._native",
    "The hot loops of the CommitLog record format (see commitlog/native.py).", -1, methods,
    NULL, NULL, NULL, NULL,
};

/* LAYOUT: every constant this module shares with the Python side, by name, for
 * commitlog/native.py to compare with record.py, columns.py, consumequeue/format.py
 * and consumequeue/tail_writer.py at import (a mismatch is an ImportError, never a
 * silent misread). */
static const struct {
    const char *name;
    long long value;
} layout[] = {
    {"HEADER_SIZE", HEADER_SIZE},
    {"BLANK_SIZE", BLANK_SIZE},
    {"MESSAGE_MAGIC", MESSAGE_MAGIC},
    {"BLANK_MAGIC", BLANK_MAGIC},
    {"FLAG_NULL_BODY", FLAG_NULL_BODY},
    {"FLAG_GROUP_OPEN", FLAG_GROUP_OPEN},
    {"FLAGS_KNOWN", FLAGS_KNOWN},
    {"RECORD_SIZE_MAX", RECORD_SIZE_MAX},
    {"AT_TOTAL_SIZE", AT_TOTAL_SIZE},
    {"AT_MAGIC", AT_MAGIC},
    {"AT_CHECKSUM", AT_CHECKSUM},
    {"AT_QUEUE_OFFSET", AT_QUEUE_OFFSET},
    {"AT_PHYSICAL_OFFSET", AT_PHYSICAL_OFFSET},
    {"AT_BORN_TS", AT_BORN_TS},
    {"AT_STORE_TS", AT_STORE_TS},
    {"AT_QUEUE_ID", AT_QUEUE_ID},
    {"AT_FLAGS", AT_FLAGS},
    {"AT_BODY_LEN", AT_BODY_LEN},
    {"AT_PROPERTIES_LEN", AT_PROPERTIES_LEN},
    {"AT_KEYS_LEN", AT_KEYS_LEN},
    {"AT_TOPIC_LEN", AT_TOPIC_LEN},
    {"AT_TAG_LEN", AT_TAG_LEN},
    {"SCAN_FULL", SCAN_FULL},
    {"SCAN_ZEROS", SCAN_ZEROS},
    {"SCAN_BLANK", SCAN_BLANK},
    {"SCAN_INVALID", SCAN_INVALID},
    {"SCAN_LIMIT", SCAN_LIMIT},
    {"UNIT_SIZE", UNIT_SIZE},
    {"UNIT_AT_COMMITLOG_OFFSET", UNIT_AT_COMMITLOG_OFFSET},
    {"UNIT_AT_SIZE", UNIT_AT_SIZE},
    {"UNIT_AT_TAG_HASH", UNIT_AT_TAG_HASH},
    {"TAIL_UNITS_ADDR", TAIL_UNITS_ADDR},
    {"TAIL_TIMES_ADDR", TAIL_TIMES_ADDR},
    {"TAIL_BLOCKS_ADDR", TAIL_BLOCKS_ADDR},
    {"TAIL_INTERVAL", TAIL_INTERVAL},
    {"TAIL_FILE_FIRST", TAIL_FILE_FIRST},
    {"TAIL_NEXT", TAIL_NEXT},
    {"TAIL_LIMIT", TAIL_LIMIT},
    {"TAIL_LAST_CLOG", TAIL_LAST_CLOG},
    {"TAIL_COLUMNS", TAIL_COLUMNS},
    {"COLUMNS_OK", COLUMNS_OK},
    {"COLUMNS_OUTSIDE", COLUMNS_OUTSIDE},
    {"COLUMNS_MISMATCH", COLUMNS_MISMATCH},
    {"COLUMNS_CHECKSUM", COLUMNS_CHECKSUM},
    {"COLUMNS_TOPIC", COLUMNS_TOPIC},
    {"COLUMNS_TAG", COLUMNS_TAG},
    {"COLUMNS_PROPERTIES", COLUMNS_PROPERTIES},
    {"COLUMNS_CHANGED", COLUMNS_CHANGED},
    {"OUT_BORN_TS", OUT_BORN_TS},
    {"OUT_STORE_TS", OUT_STORE_TS},
    {"OUT_FLAGS", OUT_FLAGS},
    {"OUT_TAG_LEN", OUT_TAG_LEN},
    {"OUT_KEYS_LEN", OUT_KEYS_LEN},
    {"OUT_HAS_KEY", OUT_HAS_KEY},
    {"OUT_BODY_OFFSETS", OUT_BODY_OFFSETS},
    {"OUT_KEY_OFFSETS", OUT_KEY_OFFSETS},
    {"OUT_EXTRA_OFFSETS", OUT_EXTRA_OFFSETS},
    {"OUT_ROWS", OUT_ROWS},
    {"DISPATCH_FULL", DISPATCH_FULL},
    {"DISPATCH_STOP", DISPATCH_STOP},
    {"DISPATCH_BLANK", DISPATCH_BLANK},
    {"DISPATCH_INVALID", DISPATCH_INVALID},
    {"DISPATCH_PHYSICAL", DISPATCH_PHYSICAL},
    {"DISPATCH_SIZE", DISPATCH_SIZE},
    {"DISPATCH_QUEUE_OFFSET", DISPATCH_QUEUE_OFFSET},
    {"DISPATCH_QUEUE_ID", DISPATCH_QUEUE_ID},
    {"DISPATCH_BORN_TS", DISPATCH_BORN_TS},
    {"DISPATCH_STORE_TS", DISPATCH_STORE_TS},
    {"DISPATCH_TOPIC_HASH", DISPATCH_TOPIC_HASH},
    {"DISPATCH_TOPIC_LEN", DISPATCH_TOPIC_LEN},
    {"DISPATCH_TAG_LEN", DISPATCH_TAG_LEN},
    {"DISPATCH_KEYS_LEN", DISPATCH_KEYS_LEN},
    {"DISPATCH_FLAGS", DISPATCH_FLAGS},
    {"DISPATCH_ROWS", DISPATCH_ROWS},
};

static int add_layout(PyObject *m) {
    PyObject *dict = PyDict_New();
    if (dict == NULL) return -1;
    for (size_t k = 0; k < sizeof layout / sizeof layout[0]; k++) {
        PyObject *value = PyLong_FromLongLong(layout[k].value);
        if (value == NULL || PyDict_SetItemString(dict, layout[k].name, value) < 0) {
            Py_XDECREF(value);
            Py_DECREF(dict);
            return -1;
        }
        Py_DECREF(value);
    }
    if (PyModule_AddObject(m, "LAYOUT", dict) < 0) {
        Py_DECREF(dict);
        return -1;
    }
    return 0;
}


PyMODINIT_FUNC PyInit__native(void) {
    const uint16_t probe = 1;
    if (*(const uint8_t *)&probe != 1) {
        PyErr_SetString(PyExc_ImportError, "commitlog._native needs a little-endian host");
        return NULL;
    }
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddIntConstant(m, "MESSAGE_MAGIC", MESSAGE_MAGIC) < 0 ||
        PyModule_AddIntConstant(m, "HEADER_SIZE", HEADER_SIZE) < 0 ||
        PyModule_AddIntConstant(m, "TAIL_COLUMNS", TAIL_COLUMNS) < 0 || add_layout(m) < 0 ||
        mqstore_add_append_types(m) < 0 || mqstore_add_feed_functions(m) < 0 ||
        mqstore_add_units_functions(m) < 0 ||
        mqstore_add_putter_type(m) < 0 ||
        mqstore_add_runs_functions(m) < 0 || mqstore_add_row_type(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
