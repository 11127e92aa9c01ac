/*
 * commitlog._native, part three: the ConsumeQueue time look-up (built into the same
 * module; consumequeue/time_index.py declares the contract and holds the pure-Python
 * twin of each function, tests/consumequeue/test_time_index.py compares them and
 * tests/commitlog/test_native_fuzz.py fuzzes them).
 *
 * time_search(head_max, head_count, block_max, block_count, timestamp_ms) -> int
 *   Both arrays are running maxima (int64, non-decreasing over their first *_count
 *   items): head_max over the per-unit timestamps of a queue's first units, block_max
 *   over the block maxima of the blocks after them. The answer is where the first
 *   item >= timestamp_ms lies: i in [0, head_count) for the head's item i, else
 *   head_count + b for block b, else -1. Each part is searched as bisect.bisect_left
 *   does (lo/hi halving), so the twin gives the same answer even for unsorted input.
 *
 * first_reaching(times, start, end, timestamp_ms) -> int
 *   The first index i in [start, end) of times (int64) with times[i] >= timestamp_ms,
 *   or -1. The block scan after time_search found the block.
 *
 * Neither releases the GIL: a call reads at most ~17 + 17 items, or one block of at
 * most TIME_INTERVAL_MAX timestamps (microseconds), less than the release costs.
 * The arrays are ours (built in memory) or a time file's mapping; every count and
 * index is checked against the buffer's length before a read.
 */
#include "../commitlog/_native.h"

/* The first index in [0, count) of a (searched as bisect_left) with a[i] >= target,
 * or count. */
static Py_ssize_t lower_bound(const int64_t *a, Py_ssize_t count, int64_t target) {
    Py_ssize_t lo = 0, hi = count;
    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        if (a[mid] < target) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    return lo;
}

/* An int64 array argument and a count of its items to use: 0 <= count <= its length. */
static int get_counted(PyObject *array, PyObject *count_obj, Py_buffer *view, int64_t *count,
                       const char *what) {
    if (as_i64(count_obj, count) < 0) return -1;
    if (get_array(array, view, 8, 0, what) < 0) return -1;
    if (*count < 0 || *count > view->len / 8) {
        PyErr_Format(PyExc_ValueError, "%s count out of range", what);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

PyObject *mqstore_time_search(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError,
                        "time_search(head_max, head_count, block_max, block_count, timestamp_ms)");
        return NULL;
    }
    int64_t target, head_count, block_count;
    if (as_i64(args[4], &target) < 0) return NULL;
    Py_buffer head, blocks;
    if (get_counted(args[0], args[1], &head, &head_count, "head_max") < 0) return NULL;
    const int64_t *head_items = head.buf;
    if (head_count > 0 && head_items[head_count - 1] >= target) {
        Py_ssize_t found = lower_bound(head_items, (Py_ssize_t)head_count, target);
        PyBuffer_Release(&head);
        return PyLong_FromSsize_t(found);
    }
    PyBuffer_Release(&head);
    if (get_counted(args[2], args[3], &blocks, &block_count, "block_max") < 0) return NULL;
    Py_ssize_t block = lower_bound(blocks.buf, (Py_ssize_t)block_count, target);
    PyBuffer_Release(&blocks);
    if (block == block_count) return PyLong_FromLong(-1);
    /* head_count + block <= two buffer lengths in items: far below 2**62, no wrap. */
    return PyLong_FromLongLong(head_count + (int64_t)block);
}

PyObject *mqstore_first_reaching(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "first_reaching(times, start, end, timestamp_ms)");
        return NULL;
    }
    int64_t start, end, target;
    if (as_i64(args[1], &start) < 0 || as_i64(args[2], &end) < 0 ||
        as_i64(args[3], &target) < 0) {
        return NULL;
    }
    Py_buffer times;
    if (get_array(args[0], &times, 8, 0, "times") < 0) return NULL;
    if (start < 0 || start > end || end > times.len / 8) {
        PyBuffer_Release(&times);
        PyErr_SetString(PyExc_ValueError, "first_reaching: need 0 <= start <= end <= len(times)");
        return NULL;
    }
    const int64_t *items = times.buf;
    int64_t found = -1;
    for (int64_t i = start; i < end; i++) {
        if (items[i] >= target) {
            found = i;
            break;
        }
    }
    PyBuffer_Release(&times);
    return PyLong_FromLongLong(found);
}
