/*
 * bench/broker_build.c: the per-record fetch path of a Kafka broker over the CommitLog,
 * in C, as a measurement (bench/broker_mapping.py compiles it with cc and loads it with
 * ctypes). It answers "what would per-record storage cost on Fetch if the batch were
 * built in C", so that the comparison with stored batches is fair to per-record storage.
 * Were that design chosen, this loop would move into commitlog/_native.c.
 *
 * Input: CommitLog records (commitlog/record.py's layout, little-endian)
 *   0 total_size u32 | 4 magic u32 | 8 checksum u64 | 16 queue_offset i64
 *   24 physical_offset i64 | 32 born_ts_ms i64 | 40 store_ts_ms i64 | 48 queue_id i32
 *   52 flags u32 | 56 body_len u32 | 60 properties_len u32 | 64 keys_len u16
 *   66 topic_len u8 | 67 tag_len u8 | 68 topic | tag | keys | properties | body
 * properties: repeated (u16 key_len, key, u32 value_len, value); the Kafka key is the
 * property named "\0key" (mqstore/commitlog_engine.py KEY_PROPERTY), every other
 * property is a Kafka header, in order.
 *
 * Output: the records section of a Kafka record batch v2 (Kafka's DefaultRecord):
 *   length varint | attributes i8 | timestamp_delta varlong | offset_delta varint
 *   | key_length varint (-1 null) | key | value_length varint (-1 null) | value
 *   | header_count varint | per header: key_length varint, key, value_length varint, value
 * (varints zig-zag). The caller writes the 61-byte batch header and the CRC-32C.
 *
 * Checksums are not verified here: the caller runs commitlog verify_records first, as
 * MessageStore.get does, so the figures include the store's verify-on-read policy.
 */
#include <stdint.h>
#include <string.h>

#define HEADER_SIZE 68
#define MESSAGE_MAGIC 0x4D515232u
#define FLAG_NULL_BODY 0x1u
#define VARINT_MAX 10

static const uint8_t KEY_PROPERTY[4] = {0, 'k', 'e', 'y'};

static inline uint32_t rd32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static inline uint16_t rd16(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2); return v; }
static inline int64_t rd64(const uint8_t *p) { int64_t v; memcpy(&v, p, 8); return v; }

static inline int vsize(int64_t value) {
    uint64_t z = ((uint64_t)value << 1) ^ (uint64_t)(value >> 63);
    int n = 1;
    while (z >= 0x80) { z >>= 7; n++; }
    return n;
}

static inline uint8_t *vput(uint8_t *p, int64_t value) {
    uint64_t z = ((uint64_t)value << 1) ^ (uint64_t)(value >> 63);
    while (z >= 0x80) { *p++ = (uint8_t)(z | 0x80); z >>= 7; }
    *p++ = (uint8_t)z;
    return p;
}

/* The sections of one record, located and bounds-checked. */
typedef struct {
    const uint8_t *props, *body;
    uint32_t props_len, body_len;
    int null_body;
    int64_t ts;
} Parts;

static int locate(const uint8_t *buf, int64_t buf_len, int64_t at, int log_append, Parts *out) {
    if (at < 0 || at + HEADER_SIZE > buf_len) return -1;
    const uint8_t *r = buf + at;
    uint32_t total = rd32(r);
    if (rd32(r + 4) != MESSAGE_MAGIC || total < HEADER_SIZE || at + total > buf_len) return -1;
    uint32_t body_len = rd32(r + 56), props_len = rd32(r + 60);
    uint64_t fixed = (uint64_t)HEADER_SIZE + r[66] + r[67] + rd16(r + 64);
    if (fixed + props_len + body_len != total) return -1;
    out->props = r + fixed;
    out->props_len = props_len;
    out->body = out->props + props_len;
    out->body_len = body_len;
    out->null_body = (rd32(r + 52) & FLAG_NULL_BODY) != 0;
    out->ts = rd64(r + (log_append ? 40 : 32));
    return 0;
}

/* Walk the properties: the key (or NULL), the header count and the bytes the headers
 * take in Kafka's encoding. -1 when the section is malformed. */
static int scan_props(const Parts *p, const uint8_t **key, int64_t *key_len, int64_t *count,
                      int64_t *header_bytes) {
    const uint8_t *c = p->props, *end = p->props + p->props_len;
    *key = NULL;
    *key_len = -1;
    *count = 0;
    *header_bytes = 0;
    while (c < end) {
        if (end - c < 2) return -1;
        uint16_t kl = rd16(c);
        c += 2;
        if (end - c < (int64_t)kl + 4) return -1;
        const uint8_t *k = c;
        c += kl;
        uint32_t vl = rd32(c);
        c += 4;
        if ((uint64_t)(end - c) < vl) return -1;
        if (*key == NULL && kl == 4 && memcmp(k, KEY_PROPERTY, 4) == 0) {
            *key = c;
            *key_len = vl;
        } else {
            *count += 1;
            *header_bytes += vsize(kl) + kl + vsize(vl) + vl;
        }
        c += vl;
    }
    return 0;
}

static uint8_t *put_headers(uint8_t *o, const Parts *p) {
    const uint8_t *c = p->props, *end = p->props + p->props_len;
    int key_seen = 0;
    while (c < end) {
        uint16_t kl = rd16(c);
        const uint8_t *k = c + 2;
        uint32_t vl = rd32(k + kl);
        const uint8_t *v = k + kl + 4;
        if (!key_seen && kl == 4 && memcmp(k, KEY_PROPERTY, 4) == 0) {
            key_seen = 1;
        } else {
            o = vput(o, kl);
            memcpy(o, k, kl);
            o += kl;
            o = vput(o, vl);
            memcpy(o, v, vl);
            o += vl;
        }
        c = v + vl;
    }
    return o;
}

/* build_records: the records of a batch from the CommitLog records at positions[0..n)
 * of buf. ts_out[0] gets the first record's timestamp (the batch base timestamp),
 * ts_out[1] the largest. Returns the bytes written to out, -1 when out_cap is too
 * small, -2 for a malformed record (at index ts_out[0] then). */
int64_t build_records(const uint8_t *buf, int64_t buf_len, const int64_t *positions,
                      int64_t n, int log_append, uint8_t *out, int64_t out_cap,
                      int64_t *ts_out) {
    uint8_t *o = out, *o_end = out + out_cap;
    int64_t base_ts = 0, max_ts = INT64_MIN;
    for (int64_t i = 0; i < n; i++) {
        Parts p;
        const uint8_t *key;
        int64_t key_len, count, header_bytes;
        if (locate(buf, buf_len, positions[i], log_append, &p) < 0 ||
            scan_props(&p, &key, &key_len, &count, &header_bytes) < 0) {
            ts_out[0] = i;
            return -2;
        }
        if (i == 0) base_ts = p.ts;
        if (p.ts > max_ts) max_ts = p.ts;
        int64_t value_len = p.null_body ? -1 : (int64_t)p.body_len;
        int64_t body = 1 + vsize(p.ts - base_ts) + vsize(i) + vsize(key_len) +
                       (key_len > 0 ? key_len : 0) + vsize(value_len) +
                       (value_len > 0 ? value_len : 0) + vsize(count) + header_bytes;
        if (o_end - o < body + VARINT_MAX) return -1;
        o = vput(o, body);
        *o++ = 0; /* attributes */
        o = vput(o, p.ts - base_ts);
        o = vput(o, i);
        o = vput(o, key_len);
        if (key_len > 0) {
            memcpy(o, key, (size_t)key_len);
            o += key_len;
        }
        o = vput(o, value_len);
        if (value_len > 0) {
            memcpy(o, p.body, (size_t)value_len);
            o += value_len;
        }
        o = vput(o, count);
        if (count) o = put_headers(o, &p);
    }
    ts_out[0] = base_ts;
    ts_out[1] = max_ts;
    return o - out;
}

/* ------------------------------------------------------------------ validate_records */

/* A zig-zag varint at *p (< end), at most 10 bytes; -1 when cut short or too long. */
static inline int vget(const uint8_t **p, const uint8_t *end, int64_t *out) {
    uint64_t z = 0;
    for (int shift = 0; shift < 70; shift += 7) {
        if (*p >= end) return -1;
        uint8_t b = *(*p)++;
        z |= (uint64_t)(b & 0x7F) << shift;
        if (b < 0x80) {
            *out = (int64_t)(z >> 1) ^ -(int64_t)(z & 1);
            return 0;
        }
    }
    return -1;
}

/* validate_records: what a broker checks inside an uncompressed producer batch before
 * storing it as is (Kafka's LogValidator walks the records too): every record's length
 * lies inside the section and is filled exactly by its fields, offset deltas run
 * 0..count-1, key/value/header lengths are -1 or fit, and the section ends with the
 * last record. Returns 0, or -(1 + i) for the first bad record i. */
int64_t validate_records(const uint8_t *p, int64_t len, int64_t count) {
    const uint8_t *end = p + len;
    for (int64_t i = 0; i < count; i++) {
        int64_t length, ts_delta, offset_delta, key_len, value_len, headers;
        if (vget(&p, end, &length) < 0 || length < 1 || length > end - p) return -(1 + i);
        const uint8_t *record_end = p + length;
        p++; /* attributes */
        if (vget(&p, record_end, &ts_delta) < 0 || vget(&p, record_end, &offset_delta) < 0 ||
            offset_delta != i || vget(&p, record_end, &key_len) < 0 || key_len < -1 ||
            key_len > record_end - p)
            return -(1 + i);
        if (key_len > 0) p += key_len;
        if (vget(&p, record_end, &value_len) < 0 || value_len < -1 || value_len > record_end - p)
            return -(1 + i);
        if (value_len > 0) p += value_len;
        if (vget(&p, record_end, &headers) < 0 || headers < 0) return -(1 + i);
        for (int64_t h = 0; h < headers; h++) {
            int64_t hk, hv;
            if (vget(&p, record_end, &hk) < 0 || hk < 0 || hk > record_end - p) return -(1 + i);
            p += hk;
            if (vget(&p, record_end, &hv) < 0 || hv < -1 || hv > record_end - p) return -(1 + i);
            if (hv > 0) p += hv;
        }
        if (p != record_end) return -(1 + i);
    }
    return p == end ? 0 : -(1 + count);
}
