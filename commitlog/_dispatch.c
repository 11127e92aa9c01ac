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
