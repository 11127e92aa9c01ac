/*
 * commitlog._native, part two: the columnar read of a run of records.
 *
 * read_columns verifies the records that ConsumeQueue units point at inside one
 * CommitLog file and gathers them into columns, in one call; slices cuts a gathered
 * buffer into per-row bytes or memoryviews. commitlog/columns.py declares the
 * contract and holds the pure-Python twin of each; tests/commitlog/test_native.py
 * compares them and tests/commitlog/test_native_fuzz.py fuzzes them.
 *
 * Unlike the rest of the module these make Python objects: read_columns three bytes
 * objects per call (their sizes are known only after the records are checked),
 * slices one object per row (what it is for).
 */
#include "_native.h"

#include <structmember.h> /* PyMemberDef's T_OBJECT, T_PYSSIZET, READONLY (3.11) */

/* A run of fewer records, and of fewer bytes, is checked and copied with the GIL held,
 * as xxh64() keeps it below 4 KiB: a few records take less than a release and
 * re-acquire, and a release hands the GIL to any thread waiting for it (a point look-up
 * such as the spot check of offset_for_time would then wait out that thread's turn).
 * The byte bound keeps a few large records (up to the store's message size limit
 * each) from holding the GIL for milliseconds: 1 MiB is about 100 us of checksum. */
#define COLUMNS_GIL_RELEASE_RECORDS_MIN 256
#define COLUMNS_GIL_RELEASE_BYTES_MIN (1 << 20)

/* What every record of a read_columns run must be (its unit's record), and where. */
typedef struct {
    const uint8_t *base; /* the file's bytes */
    int64_t len;
    int64_t file_start; /* physical offset of base[0], >= 0 */
    const uint8_t *topic;
    int64_t topic_len;
    const uint8_t *key_name; /* the property whose value is the key column */
    int64_t key_name_len;
    int32_t queue_id;
} Expect;

/* One checked record. Places are relative to its start, lengths in bytes. */
typedef struct {
    int64_t at; /* the record's position in the file */
    int64_t born, stored, flags;
    int64_t extra_at, extra_len; /* tag | keys | properties, as stored */
    int64_t tag_len, keys_len;
    int64_t body_at, body_len; /* body_len 0 for a null body */
    int64_t key_at, key_len;   /* the key_name property's value; key_at -1: none */
} Checked;

/* The first property named name in props[0, len) (value_at -1 when none); 0, or -1
 * when the section does not parse as decode_properties reads it: (u16 key length,
 * UTF-8 key, u32 value length, value) repeated, nothing left over. Every length is
 * compared with what is left, so no sum is formed that could pass len. */
static int find_property(const uint8_t *props, int64_t len, const uint8_t *name,
                         int64_t name_len, int64_t *value_at, int64_t *value_len) {
    int64_t at = 0;
    *value_at = -1;
    *value_len = 0;
    while (at < len) {
        if (len - at < 2) return -1;
        uint16_t key_len;
        memcpy(&key_len, props + at, 2);
        at += 2;
        if (len - at < key_len || !valid_utf8(props + at, key_len)) return -1;
        const uint8_t *key = props + at;
        at += key_len;
        if (len - at < 4) return -1;
        uint32_t size = read32(props + at);
        at += 4;
        if (len - at < (int64_t)size) return -1;
        if (*value_at < 0 && key_len == name_len && memcmp(key, name, key_len) == 0) {
            *value_at = at;
            *value_len = size;
        }
        at += size;
    }
    return 0;
}

/* Check the record the unit (physical, size) at queue_offset points at, in
 * record.decode_run's order (the unit inside the file, every header field, the
 * checksum when asked, topic bytes, UTF-8 tag), then parse its properties for the
 * key. COLUMNS_OK with row filled, or the first COLUMNS_* that fails. physical and
 * size come from disk: nothing is added to them before it is known to fit. */
static int check_record(const Expect *e, int64_t physical, int64_t size, int64_t queue_offset,
                        int checksum, Checked *row) {
    if (physical < e->file_start || size < HEADER_SIZE) return COLUMNS_OUTSIDE;
    int64_t at = physical - e->file_start; /* both >= 0: exact */
    if (e->len < HEADER_SIZE || at > e->len - HEADER_SIZE) return COLUMNS_OUTSIDE;
    const uint8_t *rec = e->base + at;
    int64_t record_queue_offset, record_physical;
    int32_t queue_id;
    uint16_t keys_len;
    memcpy(&record_queue_offset, rec + AT_QUEUE_OFFSET, 8);
    memcpy(&record_physical, rec + AT_PHYSICAL_OFFSET, 8);
    memcpy(&queue_id, rec + AT_QUEUE_ID, 4);
    memcpy(&keys_len, rec + AT_KEYS_LEN, 2);
    uint32_t total = read32(rec + AT_TOTAL_SIZE), flags = read32(rec + AT_FLAGS);
    uint32_t body_len = read32(rec + AT_BODY_LEN), props_len = read32(rec + AT_PROPERTIES_LEN);
    uint8_t topic_len = rec[AT_TOPIC_LEN], tag_len = rec[AT_TAG_LEN];
    uint64_t sections =
        (uint64_t)HEADER_SIZE + topic_len + tag_len + keys_len + props_len + body_len;
    if (read32(rec + AT_MAGIC) != MESSAGE_MAGIC || (int64_t)total != size ||
        record_physical != physical || record_queue_offset != queue_offset ||
        queue_id != e->queue_id || topic_len != e->topic_len || (flags & ~FLAGS_KNOWN) ||
        sections != total)
        return COLUMNS_MISMATCH;
    if (size > e->len - at) return COLUMNS_CHECKSUM; /* runs past the file */
    uint64_t seed = (uint64_t)total | ((uint64_t)MESSAGE_MAGIC << 32);
    if (checksum && xxh64(rec + BLANK_SIZE, total - BLANK_SIZE, seed) != read64(rec + AT_CHECKSUM))
        return COLUMNS_CHECKSUM;
    if (memcmp(rec + HEADER_SIZE, e->topic, topic_len) != 0) return COLUMNS_TOPIC;
    int64_t extra_at = HEADER_SIZE + topic_len;
    if (!valid_utf8(rec + extra_at, tag_len)) return COLUMNS_TAG;
    int64_t props_at = extra_at + tag_len + keys_len;
    if (find_property(rec + props_at, props_len, e->key_name, e->key_name_len, &row->key_at,
                      &row->key_len) < 0)
        return COLUMNS_PROPERTIES;
    if (row->key_at >= 0) row->key_at += props_at;
    row->at = at;
    memcpy(&row->born, rec + AT_BORN_TS, 8);
    memcpy(&row->stored, rec + AT_STORE_TS, 8);
    row->flags = flags;
    row->extra_at = extra_at;
    row->extra_len = (int64_t)tag_len + keys_len + props_len;
    row->tag_len = tag_len;
    row->keys_len = keys_len;
    row->body_at = props_at + props_len;
    row->body_len = (flags & FLAG_NULL_BODY) ? 0 : body_len;
    return COLUMNS_OK;
}

/* The columns a read fills: the rows of out (int64, OUT_ROWS rows of width). */
typedef struct {
    const int64_t *physicals, *sizes;
    int64_t first_queue_offset;
    Py_ssize_t count;
    int64_t *out;
    Py_ssize_t width;
} Columns;

static inline int64_t *out_row(const Columns *run, int row) { return run->out + row * run->width; }

/* Whether a run is worth dropping the GIL for (see COLUMNS_GIL_RELEASE_*). A size is
 * not trusted here (check_run judges it): a negative one counts as nothing, and the
 * sum stays below the bound (it returns before the sum would reach it), so no size
 * can make it overflow. */
static int run_releases_gil(const Columns *run) {
    if (run->count >= COLUMNS_GIL_RELEASE_RECORDS_MIN) return 1;
    int64_t total = 0; /* < COLUMNS_GIL_RELEASE_BYTES_MIN */
    for (Py_ssize_t i = 0; i < run->count; i++) {
        int64_t size = run->sizes[i];
        if (size <= 0) continue;
        if (size >= COLUMNS_GIL_RELEASE_BYTES_MIN - total) return 1;
        total += size;
    }
    return 0;
}

/* Pass one (no GIL): check every record, fill the fixed columns and the three
 * offset columns. Each length is at most 2**32 - 1 and count < 2**31, so no offset
 * can wrap. Returns the first bad index (and *reason), or -1. */
static Py_ssize_t check_run(const Expect *e, const Columns *run, int checksum, int *reason) {
    int64_t *born = out_row(run, OUT_BORN_TS), *stored = out_row(run, OUT_STORE_TS);
    int64_t *flags = out_row(run, OUT_FLAGS), *tag_len = out_row(run, OUT_TAG_LEN);
    int64_t *keys_len = out_row(run, OUT_KEYS_LEN), *has_key = out_row(run, OUT_HAS_KEY);
    int64_t *body_off = out_row(run, OUT_BODY_OFFSETS), *key_off = out_row(run, OUT_KEY_OFFSETS);
    int64_t *extra_off = out_row(run, OUT_EXTRA_OFFSETS);
    body_off[0] = key_off[0] = extra_off[0] = 0;
    for (Py_ssize_t i = 0; i < run->count; i++) {
        Checked row;
        int why = check_record(e, run->physicals[i], run->sizes[i], run->first_queue_offset + i,
                               checksum, &row);
        if (why != COLUMNS_OK) {
            *reason = why;
            return i;
        }
        born[i] = row.born;
        stored[i] = row.stored;
        flags[i] = row.flags;
        tag_len[i] = row.tag_len;
        keys_len[i] = row.keys_len;
        has_key[i] = row.key_at >= 0;
        body_off[i + 1] = body_off[i] + row.body_len;
        key_off[i + 1] = key_off[i] + row.key_len;
        extra_off[i + 1] = extra_off[i] + row.extra_len;
    }
    return -1;
}

/* Where pass two copies to: a buffer of size bytes, filled up to used. */
typedef struct {
    uint8_t *data;
    int64_t size, used;
} Sink;

/* Copy len bytes to the sink when they are exactly what pass one counted for the row
 * (offsets[i + 1] - offsets[i]) and fit what is left; 0 when not. */
static inline int sink_put(Sink *sink, const uint8_t *from, int64_t len, const int64_t *offsets,
                           Py_ssize_t i) {
    /* Unsigned: offsets is the caller's array, which nothing stops from changing. */
    uint64_t counted = (uint64_t)offsets[i + 1] - (uint64_t)offsets[i];
    if ((uint64_t)len != counted || len > sink->size - sink->used) return 0;
    if (len > 0) memcpy(sink->data + sink->used, from, (size_t)len);
    sink->used += len;
    return 1;
}

/* Pass two (no GIL): check each record again (not its checksum) and copy its body,
 * key and extras. The mapping is shared with other processes, so a record may have
 * changed since pass one: every copy is bounded by what is left in its sink and must
 * be the length pass one counted. Returns the first row where it is not, or -1. */
static Py_ssize_t copy_run(const Expect *e, const Columns *run, Sink *bodies, Sink *keys,
                           Sink *extras) {
    const int64_t *body_off = out_row(run, OUT_BODY_OFFSETS);
    const int64_t *key_off = out_row(run, OUT_KEY_OFFSETS);
    const int64_t *extra_off = out_row(run, OUT_EXTRA_OFFSETS);
    for (Py_ssize_t i = 0; i < run->count; i++) {
        Checked row;
        if (check_record(e, run->physicals[i], run->sizes[i], run->first_queue_offset + i, 0,
                         &row) != COLUMNS_OK)
            return i;
        const uint8_t *rec = e->base + row.at;
        if (!sink_put(bodies, rec + row.body_at, row.body_len, body_off, i) ||
            !sink_put(keys, rec + (row.key_at < 0 ? 0 : row.key_at), row.key_len, key_off, i) ||
            !sink_put(extras, rec + row.extra_at, row.extra_len, extra_off, i))
            return i;
    }
    return -1;
}

/* The checks of read_columns' arguments (a ValueError when one fails). */
static int columns_args_ok(const Columns *run, Py_ssize_t sizes_len, Py_ssize_t out_len,
                           int64_t file_start, int64_t queue_id) {
    const char *why = NULL;
    if (sizes_len != run->count * 8)
        why = "physicals and sizes differ in length";
    else if (run->count > INT32_MAX)
        why = "a run holds at most 2**31 - 1 records";
    else if (out_len % (8 * OUT_ROWS) != 0 || run->width <= run->count)
        why = "out must be int64 of OUT_ROWS rows, each longer than the run";
    else if (file_start < 0)
        why = "file_start must be >= 0";
    else if (run->first_queue_offset < 0 || run->first_queue_offset > INT64_MAX - run->count)
        why = "first_queue_offset out of range";
    else if (queue_id < INT32_MIN || queue_id > INT32_MAX)
        why = "queue_id out of range";
    if (why != NULL) PyErr_SetString(PyExc_ValueError, why);
    return why == NULL;
}

/* Pass two and the result: (-1, COLUMNS_OK, bodies, keys, extras), or (row,
 * COLUMNS_CHANGED, None, None, None) when a record changed under the read. */
static PyObject *gather_run(const Expect *e, const Columns *run) {
    int64_t body_total = out_row(run, OUT_BODY_OFFSETS)[run->count];
    int64_t key_total = out_row(run, OUT_KEY_OFFSETS)[run->count];
    int64_t extra_total = out_row(run, OUT_EXTRA_OFFSETS)[run->count];
    PyObject *bodies = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)body_total);
    PyObject *keys = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)key_total);
    PyObject *extras = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)extra_total);
    if (bodies == NULL || keys == NULL || extras == NULL) {
        Py_XDECREF(bodies);
        Py_XDECREF(keys);
        Py_XDECREF(extras);
        return NULL;
    }
    /* New objects nobody else holds yet: filled in place, then handed out. */
    Sink body_sink = {(uint8_t *)PyBytes_AS_STRING(bodies), body_total, 0};
    Sink key_sink = {(uint8_t *)PyBytes_AS_STRING(keys), key_total, 0};
    Sink extra_sink = {(uint8_t *)PyBytes_AS_STRING(extras), extra_total, 0};
    Py_ssize_t changed;
    if (run->count >= COLUMNS_GIL_RELEASE_RECORDS_MIN ||
        body_total + key_total + extra_total >= COLUMNS_GIL_RELEASE_BYTES_MIN) {
        Py_BEGIN_ALLOW_THREADS changed = copy_run(e, run, &body_sink, &key_sink, &extra_sink);
        Py_END_ALLOW_THREADS
    } else {
        changed = copy_run(e, run, &body_sink, &key_sink, &extra_sink);
    }
    if (changed >= 0) {
        Py_DECREF(bodies);
        Py_DECREF(keys);
        Py_DECREF(extras);
        return Py_BuildValue("(niOOO)", changed, COLUMNS_CHANGED, Py_None, Py_None, Py_None);
    }
    return Py_BuildValue("(niNNN)", (Py_ssize_t)-1, COLUMNS_OK, bodies, keys, extras);
}

/* read_columns(buffer, file_start, physicals, sizes, topic, queue_id,
 *              first_queue_offset, key_name, verify_checksums, out)
 *   -> (bad, reason, bodies, keys, extras)
 * Check the records that units (physicals[i], sizes[i]: int64 arrays) point at in
 * buffer (one CommitLog file starting at physical file_start): each must be exactly
 * the unit's record, as record.decode_run checks it (the checksum only when
 * verify_checksums), and its properties must parse. Then gather them into out's
 * rows (OUT_*: born and store timestamps, flags, tag and keys lengths, has-key, and
 * n + 1 offsets each into bodies, keys and extras) and three new bytes objects: the
 * bodies (a null body is empty), the values of the key_name property (empty where
 * none), and each record's tag | keys | properties as stored. Returns (-1,
 * COLUMNS_OK, bodies, keys, extras), or the first bad row, why (COLUMNS_*), and
 * None three times (out is then unspecified). Checks and copies run without the GIL
 * from COLUMNS_GIL_RELEASE_RECORDS_MIN records or COLUMNS_GIL_RELEASE_BYTES_MIN bytes
 * on. */
PyObject *mqstore_read_columns(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 10) {
        PyErr_SetString(PyExc_TypeError, "read_columns takes 10 arguments");
        return NULL;
    }
    int64_t file_start, queue_id, first;
    if (as_i64(args[1], &file_start) < 0 || as_i64(args[5], &queue_id) < 0 ||
        as_i64(args[6], &first) < 0)
        return NULL;
    int checksum = PyObject_IsTrue(args[8]);
    if (checksum < 0) return NULL;
    Py_buffer buf, physicals, sizes, topic, key_name, out;
    topic.obj = key_name.obj = NULL;
    int have_physicals = 0, have_sizes = 0, have_out = 0;
    PyObject *result = NULL;
    if (PyObject_GetBuffer(args[0], &buf, PyBUF_SIMPLE) < 0) return NULL;
    if (get_array(args[2], &physicals, 8, 0, "physicals") < 0) goto done;
    have_physicals = 1;
    if (get_array(args[3], &sizes, 8, 0, "sizes") < 0) goto done;
    have_sizes = 1;
    if (get_bytes(args[4], &topic, "topic") < 0 || get_bytes(args[7], &key_name, "key_name") < 0)
        goto done;
    if (get_array(args[9], &out, 8, 1, "out") < 0) goto done;
    have_out = 1;
    Columns run = {physicals.buf, sizes.buf, first, physicals.len / 8, out.buf,
               out.len / (8 * OUT_ROWS)};
    if (!columns_args_ok(&run, sizes.len, out.len, file_start, queue_id)) goto done;
    Expect e = {buf.buf,    buf.len,       file_start, topic.buf, topic.len, key_name.buf,
                key_name.len, (int32_t)queue_id};
    int reason = COLUMNS_OK;
    Py_ssize_t bad;
    if (run_releases_gil(&run)) {
        Py_BEGIN_ALLOW_THREADS bad = check_run(&e, &run, checksum, &reason);
        Py_END_ALLOW_THREADS
    } else {
        bad = check_run(&e, &run, checksum, &reason);
    }
    if (bad >= 0)
        result = Py_BuildValue("(niOOO)", bad, reason, Py_None, Py_None, Py_None);
    else
        result = gather_run(&e, &run);
done:
    if (have_out) PyBuffer_Release(&out);
    release(&key_name);
    release(&topic);
    if (have_sizes) PyBuffer_Release(&sizes);
    if (have_physicals) PyBuffer_Release(&physicals);
    PyBuffer_Release(&buf);
    return result;
}

/* ------------------------------------------------------------------ slices() */

/* Item i of slices: data[from:to] as bytes or as a memoryview of base. */
static PyObject *slice_item(PyObject *data, PyObject *base, int64_t from, int64_t to) {
    if (base != NULL) return PySequence_GetSlice(base, (Py_ssize_t)from, (Py_ssize_t)to);
    return PyBytes_FromStringAndSize(PyBytes_AS_STRING(data) + from, (Py_ssize_t)(to - from));
}

/* slices(data, offsets, valid, views) -> list
 * Item i is data[offsets[i]:offsets[i + 1]]: a bytes copy, or with views true a
 * read-only memoryview of data (no copy); None where valid (uint8, one per item, or
 * None for all valid) is 0. data is bytes (immutable: the views stay what they were);
 * offsets int64, n + 1 of them, 0 <= offsets[i] <= offsets[i + 1] <= len(data)
 * (a ValueError, and no list, when not). */
PyObject *mqstore_slices(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "slices(data, offsets, valid, views)");
        return NULL;
    }
    PyObject *data = args[0];
    if (!PyBytes_CheckExact(data)) {
        PyErr_SetString(PyExc_TypeError, "slices: data must be bytes");
        return NULL;
    }
    int views = PyObject_IsTrue(args[3]);
    if (views < 0) return NULL;
    Py_buffer offsets, valid;
    int have_valid = 0;
    PyObject *list = NULL, *base = NULL;
    if (get_array(args[1], &offsets, 8, 0, "offsets") < 0) return NULL;
    if (args[2] != Py_None) {
        if (get_array(args[2], &valid, 1, 0, "valid") < 0) goto done;
        have_valid = 1;
    }
    Py_ssize_t count = offsets.len / 8 - 1;
    const int64_t *at = offsets.buf;
    int64_t len = PyBytes_GET_SIZE(data);
    if (count < 0 || (have_valid && valid.len < count)) {
        PyErr_SetString(PyExc_ValueError, "slices: offsets must hold n + 1 values, valid n");
        goto done;
    }
    if (views && (base = PyMemoryView_FromObject(data)) == NULL) goto done;
    if ((list = PyList_New(count)) == NULL) goto done;
    const uint8_t *flags = have_valid ? valid.buf : NULL;
    for (Py_ssize_t i = 0; i < count; i++) {
        /* Checked where used: making an item can run a finalizer that rewrites offsets. */
        int64_t from = at[i], to = at[i + 1];
        if (from < 0 || from > to || to > len) {
            PyErr_SetString(PyExc_ValueError,
                            "slices: offsets must be non-decreasing and inside data");
            Py_CLEAR(list);
            goto done;
        }
        PyObject *item = Py_None;
        if (flags == NULL || flags[i])
            item = slice_item(data, base, from, to);
        else
            Py_INCREF(item);
        if (item == NULL) {
            Py_CLEAR(list);
            goto done;
        }
        PyList_SET_ITEM(list, i, item);
    }
done:
    Py_XDECREF(base);
    if (have_valid) PyBuffer_Release(&valid);
    PyBuffer_Release(&offsets);
    return list;
}

/* ------------------------------------------------------------------ Row, rows() */

/* A row of a batch: what mqstore.message.Message is made of (it subclasses Row and
 * adds only properties). rows() sets the five fields once and nothing can set them
 * again, so no reference cycle can pass through a row; rows() therefore takes each
 * row out of the cyclic GC, and rows a consumer holds cost the collector nothing
 * (tracked, the objects of a 500-message get made the collector walk the whole heap
 * every ~60,000 messages). The body view is made when read. */
typedef struct {
    PyObject_HEAD
    PyObject *batch;       /* the batch the row belongs to */
    PyObject *view;        /* a memoryview of the batch's bodies; NULL: no body */
    Py_ssize_t row;        /* the row's index in the batch */
    Py_ssize_t start, end; /* the body: view[start:end] */
} Row;

static void row_dealloc(PyObject *self) {
    Row *row = (Row *)self;
    Py_CLEAR(row->batch);
    Py_CLEAR(row->view);
    Py_TYPE(self)->tp_free(self);
}

static PyObject *row_body(PyObject *self, void *closure) {
    Row *row = (Row *)self;
    if (row->view == NULL) Py_RETURN_NONE;
    return PySequence_GetSlice(row->view, row->start, row->end);
}

static PyMemberDef row_members[] = {
    {"_batch", T_OBJECT, offsetof(Row, batch), READONLY, "The batch the row belongs to."},
    {"_row", T_PYSSIZET, offsetof(Row, row), READONLY, "The row's index in its batch."},
    {NULL, 0, 0, 0, NULL},
};

static PyGetSetDef row_getset[] = {
    {"body", row_body, NULL, "The body: a read-only view into the batch's bodies, or None.",
     NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

/* No tp_new: rows come from rows() only. */
static PyTypeObject RowType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "mqstore.commitlog._native.Row",
    .tp_basicsize = sizeof(Row),
    .tp_dealloc = row_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "A row of a batch (see rows()).",
    .tp_members = row_members,
    .tp_getset = row_getset,
};

int mqstore_add_row_type(PyObject *module) {
    if (PyType_Ready(&RowType) < 0) return -1;
    Py_INCREF(&RowType);
    if (PyModule_AddObject(module, "Row", (PyObject *)&RowType) < 0) {
        Py_DECREF(&RowType);
        return -1;
    }
    return 0;
}

/* Whether rows() may make cls: Row or a subclass that adds no field, no __dict__ and
 * no __weakref__ (__slots__ = ()), so that a row holds nothing but Row's fields. */
static int row_class_ok(PyObject *cls) {
    if (!PyType_Check(cls) || !PyType_IsSubtype((PyTypeObject *)cls, &RowType)) return 0;
    PyTypeObject *type = (PyTypeObject *)cls;
    int managed_dict = 0;
#ifdef Py_TPFLAGS_MANAGED_DICT
    managed_dict = (type->tp_flags & Py_TPFLAGS_MANAGED_DICT) != 0;
#endif
    return type->tp_basicsize == RowType.tp_basicsize && type->tp_itemsize == 0 &&
           type->tp_dictoffset == 0 && type->tp_weaklistoffset == 0 && !managed_dict;
}

/* One row of cls, untracked (see Row). */
static PyObject *new_row(PyTypeObject *type, PyObject *batch, PyObject *view, Py_ssize_t index,
                         int64_t start, int64_t end) {
    PyObject *obj = type->tp_alloc(type, 0);
    if (obj == NULL) return NULL;
    if (PyObject_IS_GC(obj)) PyObject_GC_UnTrack(obj);
    Row *row = (Row *)obj;
    Py_INCREF(batch);
    row->batch = batch;
    Py_XINCREF(view);
    row->view = view;
    row->row = index;
    row->start = (Py_ssize_t)start;
    row->end = (Py_ssize_t)end;
    return obj;
}

/* rows(cls, batch, view, offsets, valid) -> list
 * Row i of batch as a cls (Row, or a subclass of it with __slots__ = ()): its body is
 * view[offsets[i]:offsets[i + 1]] (view a 1-D memoryview; offsets int64, n + 1 of
 * them, non-decreasing inside view), or None where valid (uint8, or None: all
 * valid) is 0. batch must never come to hold its rows (they are out of the GC). */
PyObject *mqstore_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "rows(cls, batch, view, offsets, valid)");
        return NULL;
    }
    if (!row_class_ok(args[0])) {
        PyErr_SetString(PyExc_TypeError, "rows: cls must be Row or a subclass with __slots__ = ()");
        return NULL;
    }
    PyObject *view = args[2];
    if (!PyMemoryView_Check(view) || PyMemoryView_GET_BUFFER(view)->ndim != 1) {
        PyErr_SetString(PyExc_TypeError, "rows: view must be a 1-D memoryview");
        return NULL;
    }
    Py_buffer offsets, valid;
    int have_valid = 0;
    PyObject *list = NULL;
    if (get_array(args[3], &offsets, 8, 0, "offsets") < 0) return NULL;
    if (args[4] != Py_None) {
        if (get_array(args[4], &valid, 1, 0, "valid") < 0) goto done;
        have_valid = 1;
    }
    Py_ssize_t count = offsets.len / 8 - 1;
    const int64_t *at = offsets.buf;
    int64_t len = PyMemoryView_GET_BUFFER(view)->shape[0];
    int ok = count >= 0 && (!have_valid || valid.len >= count);
    for (Py_ssize_t i = 0; ok && i < count; i++) ok = 0 <= at[i] && at[i] <= at[i + 1];
    if (!ok || (count >= 0 && at[count] > len)) {
        PyErr_SetString(PyExc_ValueError,
                        "rows: offsets must be n + 1 non-decreasing values inside view, "
                        "valid n");
        goto done;
    }
    if ((list = PyList_New(count)) == NULL) goto done;
    /* A row never touches raw memory: its bounds only ever reach PySequence_GetSlice,
     * which clamps. (An allocation below can collect and run a finalizer that rewrites
     * offsets; that makes wrong bodies, never a wild read.) */
    const uint8_t *flags = have_valid ? valid.buf : NULL;
    PyTypeObject *type = (PyTypeObject *)args[0];
    for (Py_ssize_t i = 0; i < count; i++) {
        int has_body = flags == NULL || flags[i];
        PyObject *row = new_row(type, args[1], has_body ? view : NULL, i, at[i], at[i + 1]);
        if (row == NULL) {
            Py_CLEAR(list);
            goto done;
        }
        PyList_SET_ITEM(list, i, row);
    }
done:
    if (have_valid) PyBuffer_Release(&valid);
    PyBuffer_Release(&offsets);
    return list;
}

/* ------------------------------------------------------------------ tuples() */

/* Whether tuples() may make objects of cls as tuple.__new__(cls, row) does: asks
 * tuple.__new__(cls, ()) itself, so CPython's own rule decides (a type, a subclass of
 * tuple, and no C __new__ of its own between it and tuple: a struct sequence, which
 * frees fields past its length, is refused). 0 with its TypeError when not. */
static int tuple_class_ok(PyObject *cls) {
    PyObject *new = PyObject_GetAttrString((PyObject *)&PyTuple_Type, "__new__");
    if (new == NULL) return 0;
    PyObject *empty = PyTuple_New(0);
    PyObject *probe = empty == NULL ? NULL : PyObject_CallFunctionObjArgs(new, cls, empty, NULL);
    Py_XDECREF(empty);
    Py_DECREF(new);
    if (probe == NULL) return 0;
    Py_DECREF(probe);
    return 1;
}

/* Whether every item of a row can never be part of a reference cycle, now or later, as
 * CPython's own rule for untracking a tuple (_PyObject_GC_MAY_BE_TRACKED): an object
 * of a type without GC support (int, str, bytes, None...), an exact tuple CPython
 * untracked already (it holds only such items), or shared_empty (the caller's
 * read-only empty list, untracked by untracked_empty_list) while it is empty and
 * untracked. "Untracked right now" is not enough: a dict of atomic values is untracked
 * until it takes a container. shared_empty found changed (list.append called on it
 * directly) goes back under the collector, and the row stays there. */
static int row_untrackable(PyObject *row, Py_ssize_t width, PyObject *shared_empty) {
    for (Py_ssize_t j = 0; j < width; j++) {
        PyObject *item = PyTuple_GET_ITEM(row, j);
        if (!PyObject_IS_GC(item)) continue;
        if (PyTuple_CheckExact(item) && !PyObject_GC_IsTracked(item)) continue;
        if (item == shared_empty) {
            if (PyList_GET_SIZE(item) == 0 && !PyObject_GC_IsTracked(item)) continue;
            if (!PyObject_GC_IsTracked(item)) PyObject_GC_Track(item);
        }
        return 0;
    }
    return 1;
}

/* tuples(cls, columns[, shared_empty]) -> list
 * Row i is the cls (tuple or a subclass tuple.__new__ takes: a NamedTuple) of (columns[0][i],
 * columns[1][i], ...), made as tuple.__new__(cls, row) makes it but without the row
 * tuple: columns is a tuple of lists of one length. What the Kafka adapter makes its
 * records with, column by column. shared_empty (a list subclass instance, or None):
 * the one list a row may hold and still leave the collector (row_untrackable). */
PyObject *mqstore_tuples(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 && nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "tuples(cls, columns[, shared_empty])");
        return NULL;
    }
    PyObject *cls = args[0], *columns = args[1];
    PyObject *shared_empty = nargs == 3 ? args[2] : Py_None;
    if (shared_empty != Py_None &&
        (!PyList_Check(shared_empty) || Py_TYPE(shared_empty) == &PyList_Type)) {
        PyErr_SetString(PyExc_TypeError, "tuples: shared_empty must be a list subclass instance");
        return NULL;
    }
    if (shared_empty == Py_None) shared_empty = NULL;
    if (!PyTuple_CheckExact(columns)) {
        PyErr_SetString(PyExc_TypeError, "tuples: columns must be a tuple of lists");
        return NULL;
    }
    if (!tuple_class_ok(cls)) return NULL;
    Py_ssize_t width = PyTuple_GET_SIZE(columns), count = -1;
    for (Py_ssize_t j = 0; j < width; j++) {
        PyObject *column = PyTuple_GET_ITEM(columns, j);
        if (!PyList_CheckExact(column)) {
            PyErr_SetString(PyExc_TypeError, "tuples: every column must be a list");
            return NULL;
        }
        if (count >= 0 && PyList_GET_SIZE(column) != count) {
            PyErr_SetString(PyExc_ValueError, "tuples: the columns differ in length");
            return NULL;
        }
        count = PyList_GET_SIZE(column);
    }
    if (count < 0) count = 0; /* no column: no row */
    PyObject *list = PyList_New(count);
    if (list == NULL) return NULL;
    PyTypeObject *type = (PyTypeObject *)cls;
    /* A row of a class without an instance dict (a NamedTuple: __slots__ = ()) holds
     * only its items, like a tuple: it may leave the garbage collector's lists when no
     * item is tracked, as CPython untracks such exact tuples itself (at their first
     * collection; it never does it for subclasses). */
    int untrackable = type->tp_dictoffset == 0;
#ifdef Py_TPFLAGS_MANAGED_DICT
    if (type->tp_flags & Py_TPFLAGS_MANAGED_DICT) untrackable = 0;
#endif
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *row = type->tp_alloc(type, width);
        if (row == NULL) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, i, row); /* first: a failure below frees it with the list */
        for (Py_ssize_t j = 0; j < width; j++) {
            /* Checked again: the allocation above can collect, and a finalizer can
             * change a list (columns itself is a tuple: it cannot change). */
            PyObject *column = PyTuple_GET_ITEM(columns, j);
            if (PyList_GET_SIZE(column) != count) {
                PyErr_SetString(PyExc_ValueError, "tuples: a column changed meanwhile");
                Py_DECREF(list);
                return NULL;
            }
            PyObject *item = PyList_GET_ITEM(column, i);
            Py_INCREF(item);
            PyTuple_SET_ITEM(row, j, item);
        }
        if (untrackable && row_untrackable(row, width, shared_empty)) PyObject_GC_UnTrack(row);
    }
    return list;
}

/* ------------------------------------------------------------ untracked_empty_list() */

/* untracked_empty_list(obj) -> obj
 * Takes an empty instance of a list subclass without an instance dict or slots of its
 * own (a read-only empty list, such as the headers every record without headers
 * shares) out of the cyclic GC, so that a tuples() row holding it (as its shared_empty)
 * may leave it too. An object that is not that: TypeError. Refusing anything else keeps
 * the function from untracking a container that can hold others; an empty list the
 * caller keeps read-only cannot. */
PyObject *mqstore_untracked_empty_list(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 1) {
        PyErr_SetString(PyExc_TypeError, "untracked_empty_list(obj)");
        return NULL;
    }
    PyObject *obj = args[0];
    PyTypeObject *type = Py_TYPE(obj);
    int ok = PyList_Check(obj) && type != &PyList_Type && PyList_GET_SIZE(obj) == 0 &&
             type->tp_dictoffset == 0 && type->tp_basicsize == PyList_Type.tp_basicsize;
#ifdef Py_TPFLAGS_MANAGED_DICT
    if (type->tp_flags & Py_TPFLAGS_MANAGED_DICT) ok = 0;
#endif
    if (!ok) {
        PyErr_SetString(PyExc_TypeError, "untracked_empty_list: not an empty instance of a "
                                         "list subclass without an instance dict or slots");
        return NULL;
    }
    if (PyObject_GC_IsTracked(obj)) PyObject_GC_UnTrack(obj);
    return Py_NewRef(obj);
}

/* ------------------------------------------------------------ untracked_int_array() */

static PyObject *array_type; /* array.array, looked up on the first call */

PyObject *mqstore_array_type(void) {
    if (array_type == NULL) {
        PyObject *module = PyImport_ImportModule("array");
        if (module == NULL) return NULL;
        PyObject *found = PyObject_GetAttrString(module, "array");
        Py_DECREF(module);
        if (found == NULL) return NULL;
        if (!PyType_Check(found)) {
            Py_DECREF(found);
            PyErr_SetString(PyExc_TypeError, "array.array is not a type");
            return NULL;
        }
        array_type = found; /* kept for the life of the process */
    }
    return array_type;
}

/* untracked_int_array(obj) -> obj
 * Takes an instance of a subclass of array.array out of the cyclic GC when nothing in
 * it can reference a container: no instance dict, and every object slot of every
 * class between its type and array.array (heap types only) unset or an exact int.
 * Such an object (the shared unit log's SharedRun: raw int64 items, two int slots)
 * can never be part of a reference cycle, as CPython reasons for tuples of atomic
 * items. Anything else: TypeError. The caller keeps ints in the slots afterwards. */
PyObject *mqstore_untracked_int_array(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 1) {
        PyErr_SetString(PyExc_TypeError, "untracked_int_array(obj)");
        return NULL;
    }
    if (mqstore_array_type() == NULL) return NULL;
    PyObject *obj = args[0];
    PyTypeObject *type = Py_TYPE(obj);
    int ok = type != (PyTypeObject *)array_type &&
             PyObject_TypeCheck(obj, (PyTypeObject *)array_type) && type->tp_dictoffset == 0;
#ifdef Py_TPFLAGS_MANAGED_DICT
    if (type->tp_flags & Py_TPFLAGS_MANAGED_DICT) ok = 0;
#endif
    for (PyTypeObject *t = type; ok && t != NULL && t != (PyTypeObject *)array_type;
         t = t->tp_base) {
        if (!(t->tp_flags & Py_TPFLAGS_HEAPTYPE)) {
            ok = 0; /* a C class between: its fields are unknown here */
            break;
        }
        for (PyMemberDef *m = t->tp_members; m != NULL && m->name != NULL; m++) {
            if (m->type != T_OBJECT && m->type != T_OBJECT_EX) continue;
            if (m->offset < 0 || m->offset > type->tp_basicsize - (Py_ssize_t)sizeof(PyObject *)) {
                ok = 0;
                break;
            }
            PyObject *value = *(PyObject **)((char *)obj + m->offset);
            if (value != NULL && !PyLong_CheckExact(value)) {
                ok = 0;
                break;
            }
        }
    }
    if (!ok) {
        PyErr_SetString(PyExc_TypeError, "untracked_int_array: not an array.array subclass "
                                         "instance without a dict whose slots hold only ints");
        return NULL;
    }
    if (PyObject_GC_IsTracked(obj)) PyObject_GC_UnTrack(obj);
    return Py_NewRef(obj);
}
