/* feed_columns: the dispatcher's columns of a run of the Appender's feed entries (one
 * record each). commitlog/appender.py has the design and the pure-Python twin,
 * feed_columns_py. */
#include "_native.h"

/* feed_columns(entries, start, end, slot_map, slots, positions, sizes, queue_offsets,
 *              born, stored) -> (count, flags)
 * The dispatcher's columns of a run of one-record feed entries (Appender.append's
 * 9-tuples (position, size, topic, queue_id, queue_offset, born, stored, tag, keys)):
 * entries[start:] while each is an exact 9-tuple ending at or before end, at most
 * len(positions) of them. slots (int32) gets the queue's slot, or -1: from
 * slot_map[topic] when that is a buffer of int32 slots by queue id that holds the id
 * (-1 in it: no slot), else slot_map[(topic, queue_id)]; the int64 columns and sizes
 * (int32) get the fields. flags: 1 some entry has a tag, 2 some
 * has keys, 4 some born differs from its stored. Stops at the first other item (a
 * BatchFeed); a field of the wrong type is a TypeError, an out-of-range one a
 * ValueError. commitlog/appender.py has the pure-Python twin, feed_columns_py. */
enum { FEED_TAGGED = 1, FEED_KEYED = 2, FEED_BORN = 4 };

static int feed_field(PyObject *item, Py_ssize_t at, int64_t *out) {
    PyObject *value = PyTuple_GET_ITEM(item, at);
    if (!PyLong_CheckExact(value)) {
        PyErr_SetString(PyExc_TypeError, "feed_columns: a feed entry field is not an int");
        return -1;
    }
    return as_i64(value, out);
}

/* The slot array of the last topic looked up in slot_map (held while the call runs). */
typedef struct {
    PyObject *topic; /* that topic (a strong reference), or NULL */
    int viewing;     /* view holds its int32 slots by queue id */
    Py_buffer view;
} SlotArray;

static void slot_array_clear(SlotArray *a) {
    if (a->viewing) PyBuffer_Release(&a->view);
    a->viewing = 0;
    Py_CLEAR(a->topic);
}

/* The slot of (topic, queue_id) from slot_map[topic] when that is a buffer holding the
 * queue id: 1 (*out set), 0 ask the (topic, queue_id) key, -1 error. */
static int feed_array_slot(PyObject *slot_map, SlotArray *a, PyObject *topic, PyObject *queue_id,
                           long long *out) {
    if (a->topic != topic) {
        slot_array_clear(a);
        PyObject *found = PyDict_GetItemWithError(slot_map, topic);
        if (found == NULL && PyErr_Occurred()) return -1;
        if (found != NULL && !PyLong_CheckExact(found)) {
            Py_INCREF(found);
            int got = PyObject_GetBuffer(found, &a->view, PyBUF_SIMPLE);
            Py_DECREF(found); /* the view holds its own reference */
            if (got < 0) return -1;
            a->viewing = 1;
            if (a->view.len % 4) {
                slot_array_clear(a);
                PyErr_SetString(PyExc_ValueError, "feed_columns: a slot array must hold int32");
                return -1;
            }
        }
        a->topic = Py_NewRef(topic);
    }
    if (!a->viewing) return 0;
    int overflow = 0;
    long long id = PyLong_AsLongLongAndOverflow(queue_id, &overflow);
    if (id == -1 && PyErr_Occurred()) return -1;
    if (overflow || id < 0 || id >= a->view.len / 4) return 0;
    int32_t slot;
    memcpy(&slot, (const char *)a->view.buf + id * 4, 4);
    *out = slot;
    return 1;
}

/* One entry into row k: 1 written, 0 the run ends before it, -1 error. */
static int feed_row(PyObject *item, int64_t end, PyObject *slot_map, SlotArray *array,
                    PyObject **last_key, long long *last_slot, Py_ssize_t k, int32_t *slots,
                    int64_t *positions, int32_t *sizes, int64_t *qoffs, int64_t *born,
                    int64_t *stored, int *flags) {
    if (!PyTuple_CheckExact(item) || PyTuple_GET_SIZE(item) != 9) return 0;
    int64_t position, size;
    if (feed_field(item, 0, &position) < 0 || feed_field(item, 1, &size) < 0) return -1;
    if (size < 0 || size > INT32_MAX || position < 0 || position > INT64_MAX - size) {
        PyErr_SetString(PyExc_ValueError, "feed_columns: a position or size out of range");
        return -1;
    }
    if (position + size > end) return 0;
    PyObject *topic = PyTuple_GET_ITEM(item, 2), *queue_id = PyTuple_GET_ITEM(item, 3);
    PyObject *tag = PyTuple_GET_ITEM(item, 7), *keys = PyTuple_GET_ITEM(item, 8);
    if (!PyUnicode_CheckExact(topic) || !PyLong_CheckExact(queue_id) || !PyBytes_CheckExact(tag) ||
        !PyBytes_CheckExact(keys)) {
        PyErr_SetString(PyExc_TypeError, "feed_columns: a feed entry field has the wrong type");
        return -1;
    }
    if (feed_field(item, 4, &qoffs[k]) < 0 || feed_field(item, 5, &born[k]) < 0 ||
        feed_field(item, 6, &stored[k]) < 0)
        return -1;
    /* The slot: from the topic's slot array, else the last entry's when it is the same
     * queue (exact str and int: their hash and equality run no Python code). */
    long long from_array = -1;
    int answered = feed_array_slot(slot_map, array, topic, queue_id, &from_array);
    if (answered < 0) return -1;
    PyObject *last = *last_key;
    if (answered) {
        *last_slot = from_array;
        Py_CLEAR(*last_key);
    } else if (last == NULL || PyTuple_GET_ITEM(last, 0) != topic ||
        PyObject_RichCompareBool(PyTuple_GET_ITEM(last, 1), queue_id, Py_EQ) != 1) {
        PyObject *key = PyTuple_Pack(2, topic, queue_id);
        if (key == NULL) return -1;
        PyObject *slot = PyDict_GetItemWithError(slot_map, key);
        long long value = -1;
        if (slot == NULL && PyErr_Occurred()) {
            Py_DECREF(key);
            return -1;
        }
        if (slot != NULL) {
            value = PyLong_AsLongLong(slot);
            if (value == -1 && PyErr_Occurred()) {
                Py_DECREF(key);
                return -1;
            }
            if (value < INT32_MIN || value > INT32_MAX) value = -1;
        }
        Py_XSETREF(*last_key, key);
        *last_slot = value;
    }
    slots[k] = (int32_t)*last_slot;
    positions[k] = position;
    sizes[k] = (int32_t)size;
    *flags |= (PyBytes_GET_SIZE(tag) ? FEED_TAGGED : 0) | (PyBytes_GET_SIZE(keys) ? FEED_KEYED : 0) |
              (born[k] != stored[k] ? FEED_BORN : 0);
    return 1;
}

static PyObject *py_feed_columns(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 10) {
        PyErr_SetString(PyExc_TypeError, "feed_columns takes 10 arguments");
        return NULL;
    }
    PyObject *entries = args[0], *slot_map = args[3];
    int64_t start, end;
    if (!PyList_CheckExact(entries) || !PyDict_CheckExact(slot_map)) {
        PyErr_SetString(PyExc_TypeError, "feed_columns: entries must be a list, slot_map a dict");
        return NULL;
    }
    if (as_i64(args[1], &start) < 0 || as_i64(args[2], &end) < 0) return NULL;
    Py_buffer views[6];
    static const Py_ssize_t itemsizes[6] = {4, 8, 4, 8, 8, 8};
    static const char *const names[6] = {"slots", "positions", "sizes", "queue_offsets",
                                         "born", "stored"};
    int got = 0;
    PyObject *result = NULL, *last_key = NULL;
    SlotArray array = {.topic = NULL, .viewing = 0}; /* before any goto done: cleared there */
    for (; got < 6; got++)
        if (get_array(args[4 + got], &views[got], itemsizes[got], 1, names[got]) < 0) goto done;
    Py_ssize_t capacity = views[0].len / 4;
    for (int k = 1; k < 6; k++)
        if (views[k].len / itemsizes[k] != capacity) {
            PyErr_SetString(PyExc_ValueError, "feed_columns: columns differ in length");
            goto done;
        }
    if (start < 0 || start > PyList_GET_SIZE(entries)) {
        PyErr_SetString(PyExc_ValueError, "feed_columns: start outside the entries");
        goto done;
    }
    Py_ssize_t count = 0;
    long long last_slot = -1;
    int flags = 0;
    /* The list's size is read again every round; each item is held while in use. */
    while (count < capacity && start + count < PyList_GET_SIZE(entries)) {
        PyObject *item = Py_NewRef(PyList_GET_ITEM(entries, start + count));
        int row = feed_row(item, end, slot_map, &array, &last_key, &last_slot, count,
                           views[0].buf, views[1].buf, views[2].buf, views[3].buf, views[4].buf,
                           views[5].buf, &flags);
        Py_DECREF(item);
        if (row < 0) goto done;
        if (row == 0) break;
        count++;
    }
    result = Py_BuildValue("(ni)", count, flags);
done:
    slot_array_clear(&array);
    Py_XDECREF(last_key);
    while (got-- > 0) PyBuffer_Release(&views[got]);
    return result;
}

static PyMethodDef feed_methods[] = {
    {"feed_columns", (PyCFunction)(void (*)(void))py_feed_columns, METH_FASTCALL,
     "Columns of a run of one-record feed entries for the dispatcher; (count, flags)."},
    {NULL, NULL, 0, NULL},
};

int mqstore_add_feed_functions(PyObject *m) { return PyModule_AddFunctions(m, feed_methods); }
