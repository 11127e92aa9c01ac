/*
 * commitlog._native, part six: a Kafka record batch v2 built from the columns of a
 * CommitLog read (mqstore.batch.MessageBatch), for the broker's Fetch on the
 * CommitLog engine (built into the same module; mqstore/broker/fetch_batch.py
 * declares the contract and holds the pure-Python twin, kafka_batch_py;
 * tests/mqstore/broker/test_fetch_batch.py compares them and fuzzes this one).
 *
 * kafka_batch(first, count, budget, must_take_one, log_append, offsets, stamps,
 *             bodies, body_offsets, body_valid, keys, key_offsets, key_valid,
 *             extras, props_starts, extra_offsets, key_name) -> (bytearray | None, taken)
 *   Rows first .. first + count - 1 of the columns, as many leading rows as fit in
 *   budget bytes (the whole batch, its 61-byte header included; at least one row
 *   when must_take_one), become ONE uncompressed batch v2: base offset offsets[first],
 *   offset deltas offsets[row] - base (a compacted queue has gaps), base timestamp
 *   stamps[first], max timestamp the largest, attribute bit 3 when log_append, no
 *   producer (-1, -1, -1), partition leader epoch 0, and the CRC field 0: the caller
 *   sets it (crc32c over attributes..end, one call per batch).
 *   Per row: the value is bodies[body_offsets[i]:body_offsets[i + 1]] (null where
 *   body_valid[i] is 0; body_valid None: none null), the key keys[key_offsets[i]:
 *   key_offsets[i + 1]] (null where key_valid[i] is 0), the headers the properties
 *   extras[props_starts[i]:extra_offsets[i + 1]] (u16 name length, name, u32 value
 *   length, value; little-endian) but the first one named key_name (the key's).
 *   Returns (None, 0) when not even one row fits and must_take_one is false.
 *   Arrays are int64 (offsets, stamps, props_starts: n; the *_offsets: n + 1) and
 *   uint8 (valid: n); a bounds or order violation, unparsable properties or a field
 *   past Kafka's int32 sizes is a ValueError, never a read outside the buffers.
 *
 * Pass one (with the GIL) reads the caller's arrays once into a private table and
 * checks every span; pass two (without it) writes the records from that table and
 * the immutable bytes objects. So a caller's array changing meanwhile cannot make a
 * wild read, and the read threads of the broker build in parallel.
 */
#include "../../commitlog/_native.h"

#define BATCH_HEADER_SIZE 61
#define LOG_OVERHEAD 12 /* base_offset + length: what the batch length leaves out */
#define RECORD_SIZE_MIN 7
#define TIMESTAMP_TYPE_MASK 0x08
#define NO_PRODUCER_ID -1
#define LEADER_EPOCH 0
#define BATCH_MAGIC 2

/* One row of pass one: everything pass two writes, checked. */
typedef struct {
    int64_t offset_delta, stamp_delta; /* stamp_delta as a wrapped int64 */
    int64_t key_at, key_len;           /* key_len -1: null */
    int64_t value_at, value_len;       /* value_len -1: null */
    int64_t props_at, props_len;       /* the properties section in extras */
    int64_t skip_at;                   /* the key's pair in the section, or -1 */
    int64_t header_count, header_bytes;
    int64_t body_size; /* the record without its length varint */
} Row;

static inline int varint_size(uint64_t zigzag) {
    int n = 1;
    while (zigzag >= 0x80) {
        zigzag >>= 7;
        n++;
    }
    return n;
}

static inline uint64_t zigzag(int64_t v) { return ((uint64_t)v << 1) ^ (uint64_t)(v >> 63); }

static inline uint8_t *put_varint(uint8_t *p, int64_t v) {
    uint64_t z = zigzag(v);
    while (z >= 0x80) {
        *p++ = (uint8_t)(z | 0x80);
        z >>= 7;
    }
    *p++ = (uint8_t)z;
    return p;
}

static inline uint8_t *put_be64(uint8_t *p, uint64_t v) {
    for (int i = 7; i >= 0; i--) *p++ = (uint8_t)(v >> (8 * i));
    return p;
}

static inline uint8_t *put_be32(uint8_t *p, uint32_t v) {
    for (int i = 3; i >= 0; i--) *p++ = (uint8_t)(v >> (8 * i));
    return p;
}

static inline uint8_t *put_be16(uint8_t *p, uint16_t v) {
    *p++ = (uint8_t)(v >> 8);
    *p++ = (uint8_t)v;
    return p;
}

/* Walk one properties section: the headers it makes (all pairs but the first named
 * name) and their Kafka size. 0, or -1 when it does not parse. Every length is
 * compared with what is left, so no sum can pass len. */
static int walk_props(const uint8_t *p, int64_t len, const uint8_t *name, int64_t name_len,
                      int64_t *skip_at, int64_t *count, int64_t *bytes) {
    int64_t at = 0;
    *skip_at = -1;
    *count = 0;
    *bytes = 0;
    while (at < len) {
        const int64_t pair_at = at;
        if (len - at < 2) return -1;
        uint16_t key_len;
        memcpy(&key_len, p + at, 2);
        at += 2;
        if (len - at < key_len) return -1;
        const uint8_t *key = p + at;
        at += key_len;
        if (len - at < 4) return -1;
        uint32_t size = read32(p + at);
        at += 4;
        if (len - at < (int64_t)size) return -1;
        at += size;
        if (*skip_at < 0 && key_len == name_len && memcmp(key, name, key_len) == 0) {
            *skip_at = pair_at;
            continue;
        }
        *count += 1;
        *bytes += varint_size(zigzag(key_len)) + key_len + varint_size(zigzag(size)) + size;
    }
    return 0;
}

/* The arguments, as buffers. */
typedef struct {
    Py_buffer offsets, stamps, body_offsets, body_valid, key_offsets, key_valid, props_starts,
        extra_offsets;
    Py_buffer bodies, keys, extras, key_name;
    int have[8];
} Args;

static void release_args(Args *a) {
    Py_buffer *arrays[8] = {&a->offsets,     &a->stamps,    &a->body_offsets, &a->body_valid,
                            &a->key_offsets, &a->key_valid, &a->props_starts, &a->extra_offsets};
    for (int i = 0; i < 8; i++)
        if (a->have[i]) PyBuffer_Release(arrays[i]);
    release(&a->bodies);
    release(&a->keys);
    release(&a->extras);
    release(&a->key_name);
}

static int get_args(PyObject *const *args, Args *a) {
    memset(a, 0, sizeof(*a));
    Py_buffer *arrays[8] = {&a->offsets,     &a->stamps,    &a->body_offsets, &a->body_valid,
                            &a->key_offsets, &a->key_valid, &a->props_starts, &a->extra_offsets};
    const int at[8] = {5, 6, 8, 9, 11, 12, 14, 15};
    const Py_ssize_t size[8] = {8, 8, 8, 1, 8, 1, 8, 8};
    const char *what[8] = {"offsets",     "stamps",    "body_offsets", "body_valid",
                           "key_offsets", "key_valid", "props_starts", "extra_offsets"};
    for (int i = 0; i < 8; i++) {
        if (i == 3 && args[at[i]] == Py_None) continue; /* body_valid None: all valid */
        if (get_array(args[at[i]], arrays[i], size[i], 0, what[i]) < 0) return -1;
        a->have[i] = 1;
    }
    if (get_bytes(args[7], &a->bodies, "bodies") < 0) return -1;
    if (get_bytes(args[10], &a->keys, "keys") < 0) return -1;
    if (get_bytes(args[13], &a->extras, "extras") < 0) return -1;
    if (get_bytes(args[16], &a->key_name, "key_name") < 0) return -1;
    return 0;
}

static int fail(const char *why) {
    PyErr_SetString(PyExc_ValueError, why);
    return -1;
}

/* A span [from, to) of an n + 1 offsets array inside a buffer of len bytes. */
static int span(const Py_buffer *offsets, Py_ssize_t row, int64_t len, int64_t *at,
                int64_t *size) {
    const int64_t *o = offsets->buf;
    int64_t from = o[row], to = o[row + 1];
    if (from < 0 || to < from || to > len) return -1;
    *at = from;
    *size = to - from;
    return 0;
}

/* Pass one for row i: fill r, or -1 with a ValueError. */
static int read_row(const Args *a, Py_ssize_t i, int64_t base, int64_t base_stamp, Row *r) {
    const int64_t offset = ((const int64_t *)a->offsets.buf)[i];
    const int64_t stamp = ((const int64_t *)a->stamps.buf)[i];
    if (offset < base || (uint64_t)offset - (uint64_t)base > INT32_MAX)
        return fail("kafka_batch: offsets must increase from the first, by < 2**31");
    r->offset_delta = offset - base;
    r->stamp_delta = (int64_t)((uint64_t)stamp - (uint64_t)base_stamp);
    if (span(&a->body_offsets, i, a->bodies.len, &r->value_at, &r->value_len) < 0 ||
        span(&a->key_offsets, i, a->keys.len, &r->key_at, &r->key_len) < 0)
        return fail("kafka_batch: offsets must be non-decreasing and inside their data");
    if (a->have[3] && !((const uint8_t *)a->body_valid.buf)[i]) r->value_len = -1;
    if (!((const uint8_t *)a->key_valid.buf)[i]) r->key_len = -1;
    int64_t props_end = ((const int64_t *)a->extra_offsets.buf)[i + 1];
    r->props_at = ((const int64_t *)a->props_starts.buf)[i];
    if (r->props_at < 0 || props_end < r->props_at || props_end > a->extras.len)
        return fail("kafka_batch: a properties section lies outside extras");
    r->props_len = props_end - r->props_at;
    if (walk_props((const uint8_t *)a->extras.buf + r->props_at, r->props_len, a->key_name.buf,
                   a->key_name.len, &r->skip_at, &r->header_count, &r->header_bytes) < 0)
        return fail("kafka_batch: malformed properties");
    int64_t key = r->key_len < 0 ? 0 : r->key_len, value = r->value_len < 0 ? 0 : r->value_len;
    /* Each term is below 2**40 (buffers, varints): the sum cannot overflow. */
    r->body_size = 1 + varint_size(zigzag(r->stamp_delta)) + varint_size(zigzag(r->offset_delta)) +
                   varint_size(zigzag(r->key_len)) + key + varint_size(zigzag(r->value_len)) +
                   value + varint_size(zigzag(r->header_count)) + r->header_bytes;
    if (r->body_size > INT32_MAX) return fail("kafka_batch: a record past 2**31 - 1 bytes");
    return 0;
}

/* Pass two: one record at p (the table and immutable bytes only; no GIL). */
static uint8_t *write_row(const Row *r, const uint8_t *bodies, const uint8_t *keys,
                          const uint8_t *extras, uint8_t *p) {
    p = put_varint(p, r->body_size);
    *p++ = 0; /* attributes */
    p = put_varint(p, r->stamp_delta);
    p = put_varint(p, r->offset_delta);
    p = put_varint(p, r->key_len);
    if (r->key_len > 0) memcpy(p, keys + r->key_at, (size_t)r->key_len), p += r->key_len;
    p = put_varint(p, r->value_len);
    if (r->value_len > 0) memcpy(p, bodies + r->value_at, (size_t)r->value_len), p += r->value_len;
    p = put_varint(p, r->header_count);
    const uint8_t *props = extras + r->props_at;
    int64_t at = 0;
    while (at < r->props_len) { /* walked in pass one: it parses */
        const int64_t pair_at = at;
        uint16_t key_len;
        memcpy(&key_len, props + at, 2);
        uint32_t size = read32(props + at + 2 + key_len);
        at += 2 + key_len + 4 + (int64_t)size;
        if (pair_at == r->skip_at) continue;
        p = put_varint(p, key_len);
        memcpy(p, props + pair_at + 2, key_len);
        p += key_len;
        p = put_varint(p, (int64_t)size);
        if (size) memcpy(p, props + pair_at + 2 + key_len + 4, size);
        p += size;
    }
    return p;
}

static uint8_t *write_header(uint8_t *p, int64_t base, int64_t total, int attributes,
                             int64_t last_delta, int64_t base_stamp, int64_t max_stamp,
                             int64_t count) {
    p = put_be64(p, (uint64_t)base);
    p = put_be32(p, (uint32_t)(total - LOG_OVERHEAD));
    p = put_be32(p, LEADER_EPOCH);
    *p++ = BATCH_MAGIC;
    p = put_be32(p, 0); /* crc: the caller's */
    p = put_be16(p, (uint16_t)attributes);
    p = put_be32(p, (uint32_t)last_delta);
    p = put_be64(p, (uint64_t)base_stamp);
    p = put_be64(p, (uint64_t)max_stamp);
    p = put_be64(p, (uint64_t)(int64_t)NO_PRODUCER_ID);
    p = put_be16(p, (uint16_t)NO_PRODUCER_ID);
    p = put_be32(p, (uint32_t)NO_PRODUCER_ID);
    p = put_be32(p, (uint32_t)count);
    return p;
}

/* The lengths the arrays must have for n rows; 0, or -1 with a ValueError. */
static int check_lengths(const Args *a, int64_t *n) {
    *n = a->offsets.len / 8;
    if (a->stamps.len / 8 != *n || a->props_starts.len / 8 != *n ||
        a->body_offsets.len / 8 != *n + 1 || a->key_offsets.len / 8 != *n + 1 ||
        a->extra_offsets.len / 8 != *n + 1 || a->key_valid.len < *n ||
        (a->have[3] && a->body_valid.len < *n))
        return fail("kafka_batch: columns of n rows (offsets n + 1, valid n)");
    return 0;
}

PyObject *mqstore_kafka_batch(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 17) {
        PyErr_SetString(PyExc_TypeError, "kafka_batch takes 17 arguments");
        return NULL;
    }
    int64_t first, count, budget, n;
    if (as_i64(args[0], &first) < 0 || as_i64(args[1], &count) < 0 ||
        as_i64(args[2], &budget) < 0)
        return NULL;
    int must_take_one = PyObject_IsTrue(args[3]), log_append = PyObject_IsTrue(args[4]);
    if (must_take_one < 0 || log_append < 0) return NULL;
    Args a;
    PyObject *result = NULL, *out = NULL;
    Row *rows = NULL;
    if (get_args(args, &a) < 0 || check_lengths(&a, &n) < 0) goto done;
    if (first < 0 || count < 1 || first > n || count > n - first || budget < 0) {
        fail("kafka_batch: need 0 <= first, 1 <= count, first + count <= n, budget >= 0");
        goto done;
    }
    /* Every record takes at least RECORD_SIZE_MIN bytes: at most this many fit. */
    int64_t room = budget > BATCH_HEADER_SIZE ? (budget - BATCH_HEADER_SIZE) / RECORD_SIZE_MIN : 0;
    int64_t most = count < room + 1 ? count : room + 1;
    rows = PyMem_Malloc((size_t)most * sizeof(Row));
    if (rows == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    const int64_t base = ((const int64_t *)a.offsets.buf)[first];
    const int64_t base_stamp = ((const int64_t *)a.stamps.buf)[first];
    int64_t total = BATCH_HEADER_SIZE, max_stamp = base_stamp, taken = 0;
    for (; taken < most; taken++) {
        Row *r = &rows[taken];
        if (read_row(&a, (Py_ssize_t)(first + taken), base, base_stamp, r) < 0) goto done;
        int64_t size = varint_size(zigzag(r->body_size)) + r->body_size;
        if (size > budget - total || total + size - LOG_OVERHEAD > INT32_MAX) {
            if (taken == 0 && must_take_one && total + size - LOG_OVERHEAD <= INT32_MAX) {
                total += size; /* KIP-74: the first record goes even when larger */
                taken = 1;
            }
            break;
        }
        if (taken > 0 && r->offset_delta <= rows[taken - 1].offset_delta) {
            fail("kafka_batch: offsets must increase from the first, by < 2**31");
            goto done;
        }
        total += size;
    }
    if (taken == 0) {
        result = Py_BuildValue("(Oi)", Py_None, 0);
        goto done;
    }
    for (int64_t i = 1; i < taken; i++) {
        int64_t stamp = ((const int64_t *)a.stamps.buf)[first + i];
        if (stamp > max_stamp) max_stamp = stamp;
    }
    out = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)total);
    if (out == NULL) goto done;
    uint8_t *p = (uint8_t *)PyByteArray_AS_STRING(out), *end = p + total;
    const uint8_t *bodies = a.bodies.buf, *keys = a.keys.buf, *extras = a.extras.buf;
    int attributes = log_append ? TIMESTAMP_TYPE_MASK : 0;
    Py_BEGIN_ALLOW_THREADS
    p = write_header(p, base, total, attributes, rows[taken - 1].offset_delta, base_stamp,
                     max_stamp, taken);
    for (int64_t i = 0; i < taken; i++) p = write_row(&rows[i], bodies, keys, extras, p);
    Py_END_ALLOW_THREADS
    assert(p == end);
    (void)end;
    result = Py_BuildValue("(OL)", out, (long long)taken);
done:
    Py_XDECREF(out);
    PyMem_Free(rows);
    release_args(&a);
    return result;
}

/* ------------------------------------------------------------------ kafka_values */

/* A zig-zag varint at *pos below limit (spans already checked it: this only reads). */
static int64_t read_varint(const uint8_t *p, Py_ssize_t limit, Py_ssize_t *pos) {
    uint64_t result = 0;
    for (int shift = 0; shift < 70 && *pos < limit; shift += 7) {
        uint8_t byte = p[(*pos)++];
        result |= (uint64_t)(byte & 0x7F) << shift;
        if (!(byte & 0x80)) break;
    }
    return (int64_t)(result >> 1) ^ -(int64_t)(result & 1);
}

#define VALUE_FIELDS 4 /* timestamp delta, key size, value size, header count */
#define SPAN_FIELDS 7  /* record_spans' row (segmented/_records.c) */

/* kafka_values(buffer, start, end, count, last_delta) -> (rows, values, value_offsets)
 *   The records of a produced batch (its header checked: record_spans' arguments),
 *   walked and checked by record_spans (so both raise alike), as columns for the
 *   store's columnar put: rows holds count * 4 native int64 per record [timestamp
 *   delta, key size (-1: null), value size (-1: null), header count]; values the
 *   values one after another (a null one is empty) and value_offsets count + 1 int64
 *   cutting them (Arrow's binary layout). */
PyObject *mqstore_kafka_values(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "kafka_values(buffer, start, end, count, last_delta)");
        return NULL;
    }
    PyObject *spans = mqstore_record_spans(self, args, nargs); /* checks everything */
    if (spans == NULL) return NULL;
    PyObject *rows = NULL, *values = NULL, *offsets = NULL, *result = NULL;
    Py_buffer view;
    if (get_bytes(args[0], &view, "buffer") < 0) {
        Py_DECREF(spans);
        return NULL;
    }
    const Py_ssize_t count = PyBytes_GET_SIZE(spans) / (SPAN_FIELDS * 8);
    const int64_t *span = (const int64_t *)PyBytes_AS_STRING(spans);
    int64_t total = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        int64_t value_size = span[i * SPAN_FIELDS + 4];
        total += value_size > 0 ? value_size : 0; /* spans lie inside the buffer */
    }
    rows = PyBytes_FromStringAndSize(NULL, count * VALUE_FIELDS * 8);
    values = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total);
    offsets = PyBytes_FromStringAndSize(NULL, (count + 1) * 8);
    if (rows == NULL || values == NULL || offsets == NULL) goto done;
    const uint8_t *p = view.buf;
    /* The buffer may have changed since the walk (a bytearray): bound every read. */
    const Py_ssize_t limit = view.len;
    int64_t *row = (int64_t *)PyBytes_AS_STRING(rows);
    int64_t *offset = (int64_t *)PyBytes_AS_STRING(offsets);
    uint8_t *out = (uint8_t *)PyBytes_AS_STRING(values);
    int64_t used = 0;
    offset[0] = 0;
    for (Py_ssize_t i = 0; i < count; i++, row += VALUE_FIELDS) {
        const int64_t *s = span + i * SPAN_FIELDS;
        Py_ssize_t cursor = (Py_ssize_t)s[5];
        read_varint(p, limit, &cursor); /* the record's length */
        cursor += 1;                    /* attributes */
        row[0] = read_varint(p, limit, &cursor);
        row[1] = s[2];
        row[2] = s[4];
        int64_t value_at = s[3], value_size = s[4] > 0 ? s[4] : 0;
        cursor = (Py_ssize_t)(value_at + value_size);
        row[3] = read_varint(p, limit, &cursor);
        if (!slice_inside(value_at, value_size, limit) || value_size > total - used) {
            PyErr_SetString(PyExc_ValueError, "kafka_values: the buffer changed while read");
            goto done;
        }
        if (value_size) memcpy(out + used, p + value_at, (size_t)value_size);
        used += value_size;
        offset[i + 1] = used;
    }
    result = PyTuple_Pack(3, rows, values, offsets);
done:
    Py_XDECREF(rows);
    Py_XDECREF(values);
    Py_XDECREF(offsets);
    Py_DECREF(spans);
    release(&view);
    return result;
}
