/*
 * What the C files of mqstore.commitlog._native share (_native.c: the module, the
 * encoders; _scan.c: the checks of written records; _columns.c: the columnar read):
 * the record layout as commitlog/record_format.py declares it, XXH64, and the
 * argument and bounds helpers.
 * Everything here is static inline, so each file gets its own copy and an unused
 * helper is no warning.
 *
 * Record header (little-endian), as in record.py:
 *   0 total_size u32 | 4 magic u32 | 8 checksum u64 | 16 queue_offset i64
 *   24 physical_offset i64 | 32 born_ts_ms i64 | 40 store_ts_ms i64 | 48 queue_id i32
 *   52 flags u32 | 56 body_len u32 | 60 properties_len u32 | 64 keys_len u16
 *   66 topic_len u8 | 67 tag_len u8 | 68 topic | tag | keys | properties | body
 * checksum = XXH64(bytes [16, total_size), seed = total_size | magic << 32).
 *
 * XXH64 is implemented from its specification (xxhash.com, doc/xxhash_spec.md);
 * tests/commitlog/test_native.py checks it against the xxhash package.
 */
#ifndef MQSTORE_NATIVE_H
#define MQSTORE_NATIVE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define HEADER_SIZE 68
#define BLANK_SIZE 16
#define MESSAGE_MAGIC 0x4D515232u
#define BLANK_MAGIC 0x4D514232u
#define FLAG_NULL_BODY 0x1u
#define FLAG_GROUP_OPEN 0x2u /* not the last record of its append group (record.py) */
#define FLAGS_KNOWN (FLAG_NULL_BODY | FLAG_GROUP_OPEN)
#define RECORD_SIZE_MAX 0xFFFFFFFFLL /* total_size is a u32 */

/* The ConsumeQueue unit (consumequeue/format.py UNIT): write_units writes it,
 * units_in_place compares it. */
enum { UNIT_AT_COMMITLOG_OFFSET = 0, UNIT_AT_SIZE = 8, UNIT_AT_TAG_HASH = 12, UNIT_SIZE = 20 };

/* The ConsumeQueue tail writer's slot table (consumequeue/tail_writer.py): one row of
 * int64 per queue, columns as TAIL_* below. A row with units_addr 0 is detached. */
enum {
    TAIL_UNITS_ADDR,  /* the mapping of the queue's last unit file */
    TAIL_TIMES_ADDR,  /* the first timestamp of its time file */
    TAIL_BLOCKS_ADDR, /* the first block maximum of its time file */
    TAIL_INTERVAL,    /* units per block */
    TAIL_FILE_FIRST,  /* queue offset of unit 0 of that file */
    TAIL_NEXT,        /* the queue's max offset: the only offset appended here */
    TAIL_LIMIT,       /* first queue offset not reserved on disk (or past the file) */
    TAIL_LAST_CLOG,   /* commitlog offset of the queue's last unit */
    TAIL_COLUMNS
};

/* Field offsets of the header above. commitlog/native.py compares every one of these
 * (and the sizes and magics) with commitlog/record_format.py at import: LAYOUT in
 * _native.c. */
enum {
    AT_TOTAL_SIZE = 0,
    AT_MAGIC = 4,
    AT_CHECKSUM = 8,
    AT_QUEUE_OFFSET = 16,
    AT_PHYSICAL_OFFSET = 24,
    AT_BORN_TS = 32,
    AT_STORE_TS = 40,
    AT_QUEUE_ID = 48,
    AT_FLAGS = 52,
    AT_BODY_LEN = 56,
    AT_PROPERTIES_LEN = 60,
    AT_KEYS_LEN = 64,
    AT_TOPIC_LEN = 66,
    AT_TAG_LEN = 67,
};

/* ------------------------------------------------------------------ XXH64 */

static const uint64_t P1 = 0x9E3779B185EBCA87ULL;
static const uint64_t P2 = 0xC2B2AE3D27D4EB4FULL;
static const uint64_t P3 = 0x165667B19E3779F9ULL;
static const uint64_t P4 = 0x85EBCA77C2B2AE63ULL;
static const uint64_t P5 = 0x27D4EB2F165667C5ULL;

static inline uint64_t rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

static inline uint64_t read64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8); /* little-endian hosts only: checked at import */
    return v;
}

static inline uint32_t read32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static inline uint64_t xxh_round(uint64_t acc, uint64_t input) {
    acc += input * P2;
    acc = rotl64(acc, 31);
    return acc * P1;
}

static inline uint64_t xxh_merge(uint64_t acc, uint64_t val) {
    acc ^= xxh_round(0, val);
    return acc * P1 + P4;
}

static inline uint64_t xxh64(const uint8_t *p, size_t len, uint64_t seed) {
    const uint8_t *end = p + len;
    uint64_t h;
    if (len >= 32) {
        const uint8_t *limit = end - 32;
        uint64_t v1 = seed + P1 + P2, v2 = seed + P2, v3 = seed, v4 = seed - P1;
        do {
            v1 = xxh_round(v1, read64(p));
            v2 = xxh_round(v2, read64(p + 8));
            v3 = xxh_round(v3, read64(p + 16));
            v4 = xxh_round(v4, read64(p + 24));
            p += 32;
        } while (p <= limit);
        h = rotl64(v1, 1) + rotl64(v2, 7) + rotl64(v3, 12) + rotl64(v4, 18);
        h = xxh_merge(h, v1);
        h = xxh_merge(h, v2);
        h = xxh_merge(h, v3);
        h = xxh_merge(h, v4);
    } else {
        h = seed + P5;
    }
    h += (uint64_t)len;
    while (p + 8 <= end) {
        h ^= xxh_round(0, read64(p));
        h = rotl64(h, 27) * P1 + P4;
        p += 8;
    }
    if (p + 4 <= end) {
        h ^= (uint64_t)read32(p) * P1;
        h = rotl64(h, 23) * P2 + P3;
        p += 4;
    }
    while (p < end) {
        h ^= (uint64_t)(*p) * P5;
        h = rotl64(h, 11) * P1;
        p++;
    }
    h ^= h >> 33;
    h *= P2;
    h ^= h >> 29;
    h *= P3;
    h ^= h >> 32;
    return h;
}

/* The XXH64 (seed 0) of a run's topics, remembered for the last topic seen: the
 * records of a run mostly share one topic, and a hash of a few bytes is a serial chain
 * of multiplies per record (scan_records and dispatch_columns). The bytes are copied,
 * so a hit is the hash of the bytes compared, whatever the buffer does later. */
typedef struct {
    uint8_t bytes[255]; /* a topic is at most 255 bytes (a u8 length) */
    int len;            /* -1: nothing remembered yet */
    uint64_t hash;
} TopicMemo;

static inline void topic_memo_init(TopicMemo *memo) {
    memo->len = -1;
    memo->hash = 0;
}

static inline uint64_t topic_memo_hash(TopicMemo *memo, const uint8_t *topic, uint8_t len) {
    if (memo->len != (int)len || memcmp(memo->bytes, topic, len) != 0) {
        memcpy(memo->bytes, topic, len);
        memo->len = len;
        memo->hash = xxh64(memo->bytes, len, 0);
    }
    return memo->hash;
}

/* ------------------------------------------------------------------ helpers */

static inline void put_u16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }
static inline void put_u32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static inline void put_u64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }

/* A bytes object's data without a buffer export; other bytes-likes via the buffer
 * protocol (view->obj is set only then, and must be released). */
static inline int get_bytes(PyObject *obj, Py_buffer *view, const char *what) {
    if (PyBytes_CheckExact(obj)) {
        view->obj = NULL;
        view->buf = PyBytes_AS_STRING(obj);
        view->len = PyBytes_GET_SIZE(obj);
        return 0;
    }
    if (PyObject_GetBuffer(obj, view, PyBUF_SIMPLE) < 0) {
        PyErr_Format(PyExc_TypeError, "%s must be bytes-like, not %.100s", what,
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    return 0;
}

static inline void release(Py_buffer *view) {
    if (view->obj != NULL) PyBuffer_Release(view);
}

static inline int as_i64(PyObject *obj, int64_t *out) {
    long long v = PyLong_AsLongLong(obj);
    if (v == -1 && PyErr_Occurred()) return -1;
    *out = (int64_t)v;
    return 0;
}

/* An integer array argument: C-contiguous, aligned, items of itemsize bytes (so a
 * caller passing int32 where int64 is meant gets a TypeError, not a misread, and no
 * load below is misaligned). Returns -1 with an exception set. */
static inline int get_array(PyObject *obj, Py_buffer *view, Py_ssize_t itemsize, int writable,
                     const char *what) {
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) < 0) return -1;
    const char *format = view->format != NULL ? view->format : "B";
    if (format[0] == '@' || format[0] == '=' || format[0] == '<') format++;
    int integer = format[0] != '\0' && format[1] == '\0' && strchr("bBhHiIlLqQnN", format[0]);
    if (!integer || view->itemsize != itemsize || (uintptr_t)view->buf % (uintptr_t)itemsize) {
        PyErr_Format(PyExc_TypeError, "%s must be a contiguous, aligned array of %zd-byte integers",
                     what, itemsize);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* Whether [at, at + size) lies inside [0, len), without computing at + size (which
 * can wrap for values read from disk). */
static inline int slice_inside(int64_t at, int64_t size, int64_t len) {
    return at >= 0 && size >= 0 && size <= len && at <= len - size;
}

/* Strict UTF-8 (no overlongs, no surrogates, at most U+10FFFF), as Python decodes. */
static inline int valid_utf8(const uint8_t *p, size_t len) {
    size_t i = 0;
    while (i < len) {
        uint8_t c = p[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t n;
        uint32_t cp;
        if (c >= 0xC2 && c <= 0xDF) {
            n = 1;
            cp = c & 0x1F;
        } else if (c >= 0xE0 && c <= 0xEF) {
            n = 2;
            cp = c & 0x0F;
        } else if (c >= 0xF0 && c <= 0xF4) {
            n = 3;
            cp = c & 0x07;
        } else {
            return 0;
        }
        if (i + n >= len) return 0; /* the last continuation byte is past the end */
        for (size_t k = 1; k <= n; k++) {
            if ((p[i + k] & 0xC0) != 0x80) return 0;
            cp = (cp << 6) | (p[i + k] & 0x3F);
        }
        if ((n == 2 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) ||
            (n == 3 && (cp < 0x10000 || cp > 0x10FFFF)))
            return 0;
        i += n + 1;
    }
    return 1;
}

/* ------------------------------------------------------------------ _columns.c */

/* Why read_columns stopped at a record (commitlog/columns.py declares the same
 * codes and compares them at import, through LAYOUT). */
enum {
    COLUMNS_OK = 0,
    COLUMNS_OUTSIDE = 1,    /* the unit points outside the file */
    COLUMNS_MISMATCH = 2,   /* the header is not the unit's record */
    COLUMNS_CHECKSUM = 3,   /* checksum mismatch, or the record runs past the file */
    COLUMNS_TOPIC = 4,      /* the topic bytes are not the queue's */
    COLUMNS_TAG = 5,        /* the tag is not UTF-8 */
    COLUMNS_PROPERTIES = 6, /* the properties section does not parse */
    COLUMNS_CHANGED = 7,    /* the record changed between read_columns' two passes */
};

/* The rows of read_columns' out array: int64, OUT_ROWS rows of width >= count + 1. */
enum {
    OUT_BORN_TS,
    OUT_STORE_TS,
    OUT_FLAGS,
    OUT_TAG_LEN,
    OUT_KEYS_LEN,
    OUT_HAS_KEY,
    OUT_BODY_OFFSETS,
    OUT_KEY_OFFSETS,
    OUT_EXTRA_OFFSETS,
    OUT_ROWS
};

PyObject *mqstore_read_columns(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *mqstore_slices(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *mqstore_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *mqstore_tuples(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *mqstore_untracked_empty_list(PyObject *self, PyObject *const *args,
                                     Py_ssize_t nargs);
PyObject *mqstore_untracked_int_array(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
int mqstore_add_row_type(PyObject *module); /* the type Row, for rows() */
/* commitlog/_native.c: one record's bytes at dst (room for total; lengths checked). */
void write_record(uint8_t *dst, uint32_t total, int64_t queue_offset, int64_t physical,
                  int64_t born, int64_t stored, int32_t queue_id, uint32_t flags,
                  const Py_buffer *topic, const Py_buffer *tag, const Py_buffer *keys,
                  const Py_buffer *props, const Py_buffer *body);
/* commitlog/_appender.c: AppendLock, Appender, Putter. */
int mqstore_add_append_types(PyObject *module);
int mqstore_is_appender(PyObject *obj);
/* Appender.append's 7 arguments (topic, queue_id, body, tag, born_ts_ms, keys,
 * properties) on an object mqstore_is_appender accepted. */
PyObject *mqstore_appender_append(PyObject *appender, PyObject *const *args);
/* mqstore/_put.c: Putter, MessageStore.put's common case in front of an Appender. */
int mqstore_add_putter_type(PyObject *module);
/* consumequeue/_runs.c: runs_append, the shared unit log's pass over its units. */
int mqstore_add_runs_functions(PyObject *module);
/* consumequeue/_time.c: the ConsumeQueue time look-up. */
PyObject *mqstore_time_search(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *mqstore_first_reaching(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

/* commitlog/_columns.c: array.array (a borrowed reference kept for the life of the
 * process), or NULL with an exception set. */
PyObject *mqstore_array_type(void);

/* commitlog/_feed.c: feed_columns. */
int mqstore_add_feed_functions(PyObject *m);

/* consumequeue/_units.c: write_units. */
int mqstore_add_units_functions(PyObject *m);

/* ------------------------------------------------------------------ _dispatch.c */

/* Why dispatch_columns stopped (commitlog/header_scan.py: DISPATCH_*). */
enum {
    DISPATCH_FULL = 0,    /* out is full: call again from end */
    DISPATCH_STOP = 1,    /* every record that starts before stop is taken */
    DISPATCH_BLANK = 2,   /* a valid end-of-file blank record: end is the file's end */
    DISPATCH_INVALID = 3, /* the record at end does not parse (or verify) */
};

/* The rows of dispatch_columns' out array: int64, DISPATCH_ROWS rows of one width. */
enum {
    DISPATCH_PHYSICAL,
    DISPATCH_SIZE,
    DISPATCH_QUEUE_OFFSET,
    DISPATCH_QUEUE_ID,
    DISPATCH_BORN_TS,
    DISPATCH_STORE_TS,
    DISPATCH_TOPIC_HASH, /* XXH64 (seed 0) of the topic bytes, as a signed int64 */
    DISPATCH_TOPIC_LEN,
    DISPATCH_TAG_LEN,
    DISPATCH_KEYS_LEN,
    DISPATCH_FLAGS,
    DISPATCH_ROWS
};

/* commitlog/_scan.c: checks of written records (SCAN_* are scan_records' statuses,
 * record.py's SCAN_* and LAYOUT) */
enum { SCAN_FULL = 0, SCAN_ZEROS = 1, SCAN_BLANK = 2, SCAN_INVALID = 3, SCAN_LIMIT = 4 };
PyObject *mqstore_scan_records(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *mqstore_verify_records(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *mqstore_gather(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

PyObject *mqstore_dispatch_columns(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *mqstore_units_in_place(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *mqstore_run_stretches(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *mqstore_populate_read(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

/* segmented/_records.c: the records of a Kafka record batch v2, walked. */
PyObject *mqstore_record_spans(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

/* mqstore/broker/_kafka_codec.c: a Kafka record batch v2 from a read's columns. */
PyObject *mqstore_kafka_batch(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *mqstore_kafka_values(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

#endif /* MQSTORE_NATIVE_H */
