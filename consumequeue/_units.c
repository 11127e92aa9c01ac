/*
 * commitlog._native: write_units, the ConsumeQueue tail writer's loop
 * (consumequeue/tail_writer.py holds the slot table and the pure-Python twin;
 * tests/commitlog/test_native.py and the fuzz compare them). Moved from _native.c
 * unchanged, to keep that file under 800 lines; the slot table's columns (TAIL_*) are
 * in _native.h, which LAYOUT exports.
 */
#include "../commitlog/_native.h"

/* The most units a queue file holds: units_per_file is a u32 in the time file header
 * (consumequeue/format.py). Bounds a row's index so that index * 20 cannot wrap. */
#define TAIL_UNITS_IN_FILE_MAX 0xFFFFFFFFLL

/* The in-file index of the unit at queue offset offset when row takes it, else -1.
 * A row takes the next unit of its queue (TAIL_NEXT), inside the span reserved for it
 * ([FILE_FIRST, LIMIT), what the tail writer mapped), with a positive block interval
 * (a zero would trap in the division). Comparisons only: no sum of row values (which
 * a caller could set to anything) is formed before it is known to be in range. */
static inline int64_t row_index(const int64_t *row, int64_t offset) {
    if (row[TAIL_UNITS_ADDR] == 0 || row[TAIL_INTERVAL] <= 0 || offset != row[TAIL_NEXT] ||
        offset < row[TAIL_FILE_FIRST] || offset >= row[TAIL_LIMIT])
        return -1;
    uint64_t index = (uint64_t)offset - (uint64_t)row[TAIL_FILE_FIRST]; /* exact: >= 0 */
    return index > (uint64_t)TAIL_UNITS_IN_FILE_MAX ? -1 : (int64_t)index;
}

#define WRITE_UNITS_GIL_RELEASE_MIN 256

/* write_units' loop (see there); returns the index of the first unit not written. */
static Py_ssize_t write_units_loop(int64_t *table, Py_ssize_t rows, const int32_t *slots,
                                   const int64_t *qoffs, const int64_t *clogs,
                                   const int32_t *sizes, const int64_t *tags,
                                   const int64_t *times, Py_ssize_t start, Py_ssize_t count) {
    Py_ssize_t i = start;
    for (; i < count; i++) {
        int32_t slot = slots[i];
        if (slot < 0 || slot >= rows) break;
        int64_t *row = table + (Py_ssize_t)slot * TAIL_COLUMNS;
        int64_t offset = qoffs[i];
        int64_t index = row_index(row, offset);
        if (index < 0 || clogs[i] <= row[TAIL_LAST_CLOG] || sizes[i] <= 0) break;
        int64_t stamp = times[i];
        uint8_t *times_at = (uint8_t *)(uintptr_t)row[TAIL_TIMES_ADDR] + index * 8;
        memcpy(times_at, &stamp, 8);
        uint8_t *block = (uint8_t *)(uintptr_t)row[TAIL_BLOCKS_ADDR] +
                         (index / row[TAIL_INTERVAL]) * 8;
        int64_t maximum;
        memcpy(&maximum, block, 8);
        if (maximum < stamp) memcpy(block, &stamp, 8);
        uint8_t *unit = (uint8_t *)(uintptr_t)row[TAIL_UNITS_ADDR] + index * UNIT_SIZE;
        memcpy(unit + UNIT_AT_COMMITLOG_OFFSET, &clogs[i], 8);
        memcpy(unit + UNIT_AT_TAG_HASH, &tags[i], 8);
        __atomic_store_n((int32_t *)(void *)(unit + UNIT_AT_SIZE), sizes[i], __ATOMIC_RELEASE);
        row[TAIL_NEXT] = offset + 1;
        row[TAIL_LAST_CLOG] = clogs[i];
    }
    return i;
}

/* write_units(table, slots, queue_offsets, commitlog_offsets, sizes, tag_hashes,
 *             timestamps, start) -> index
 * Append units[start:] (int32 slots, int64 columns but int32 sizes) at the tails of
 * their queues while each is the next unit of an attached row, in reserved space, with
 * a commitlog offset above the previous unit's. Returns the first index it did not
 * write (len when all were): the caller writes that one the slow way. Unit layout:
 * commitlog_offset i64 @0, size i32 @8, tag_hash i64 @12; the size is stored last
 * (release order), as it makes the unit visible to readers in other processes. */
static PyObject *py_write_units(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "write_units takes 8 arguments");
        return NULL;
    }
    int64_t start;
    if (as_i64(args[7], &start) < 0) return NULL;
    Py_buffer views[7];
    int got = 0;
    PyObject *result = NULL;
    static const Py_ssize_t itemsizes[7] = {8, 4, 8, 8, 4, 8, 8};
    static const char *const names[7] = {"table", "slots",      "queue_offsets", "commitlog_offsets",
                                         "sizes", "tag_hashes", "timestamps"};
    for (; got < 7; got++)
        if (get_array(args[got], &views[got], itemsizes[got], got == 0, names[got]) < 0) goto done;
    Py_ssize_t count = views[1].len / 4;
    Py_ssize_t rows = views[0].len / (TAIL_COLUMNS * 8);
    int lengths_ok = views[0].len % (TAIL_COLUMNS * 8) == 0;
    for (int k = 2; k < 7; k++) lengths_ok &= views[k].len / itemsizes[k] == count;
    if (!lengths_ok || start < 0 || start > count) {
        PyErr_SetString(PyExc_ValueError, "write_units: columns differ in length");
        goto done;
    }
    int64_t *table = views[0].buf;
    const int32_t *slots = views[1].buf, *sizes = views[4].buf;
    const int64_t *qoffs = views[2].buf, *clogs = views[3].buf, *tags = views[5].buf,
                  *times = views[6].buf;
    Py_ssize_t i;
    /* Without the GIL from WRITE_UNITS_GIL_RELEASE_MIN units on: the loop touches only
     * the table and the mappings (the caller holds the ConsumeQueue lock and references
     * to every mapped file), and a page fault on a queue file's next page then stalls
     * only the dispatcher. A round of a few units (a waiting reader's own, issue 15)
     * keeps it: dropping it hands the GIL to a writer thread until that thread blocks,
     * tens of microseconds added to the reader's wake-up. */
    if (count - start >= WRITE_UNITS_GIL_RELEASE_MIN) {
        Py_BEGIN_ALLOW_THREADS i = write_units_loop(table, rows, slots, qoffs, clogs, sizes, tags,
                                                    times, start, count);
        Py_END_ALLOW_THREADS
    } else {
        i = write_units_loop(table, rows, slots, qoffs, clogs, sizes, tags, times, start, count);
    }
    result = PyLong_FromSsize_t(i);
done:
    while (got-- > 0) PyBuffer_Release(&views[got]);
    return result;
}

static PyMethodDef units_methods[] = {
    {"write_units", (PyCFunction)(void (*)(void))py_write_units, METH_FASTCALL,
     "Append ConsumeQueue units at their queues' tails; the first index not written."},
    {NULL, NULL, 0, NULL},
};

int mqstore_add_units_functions(PyObject *m) { return PyModule_AddFunctions(m, units_methods); }
