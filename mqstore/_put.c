/*
 * commitlog._native: Putter, MessageStore.put's common case in one C call.
 *
 * Putter(appender, limits, holder, slow, help) is built by the store (mqstore/store_write.py,
 * _install_put) over its CommitLog's Appender. Its bound method put(topic, queue_id,
 * body, *, keys=(), tag=None, properties=None, born_timestamp_ms=None) becomes the
 * store's `put`. For a message with nothing rare about it, it does in C what the
 * Python put does, with no Python frame:
 *
 *   - the checks: `enabled` (the store's async flush without a replicated wait), an
 *     exact str topic and an exact int queue_id below limits[topic] (the store's
 *     _put_topics: the partition count of a topic a put already checked), no keys,
 *     no properties, and `holder.failure is None` (the dispatcher's failure);
 *   - the append: Appender.append's C function (checks, queue offset, encode,
 *     checksum, position, feed entry, the listener's gate), the append lock taken
 *     and released in C;
 *   - backpressure: help(position) when the record starts past `help_past` (the store's
 *     _help_dispatch_if_behind, which moves help_past on).
 *
 * Everything else (any other argument, a queue not yet checked, a closed store, a
 * roll, a compacted topic...) is `slow(*args, **kwargs)`: the Python put, which
 * raises the typed StoreErrors. The Appender returns None having changed nothing for
 * what it leaves to the general path, so the slow path starts from the same state.
 * The Python put is this type's pure-Python twin (a build without the C module runs
 * it alone); tests/mqstore/test_put.py runs the same puts through both.
 *
 * Nothing set from Python is trusted: limits must stay an exact dict (checked per
 * call), a limit or queue id that is not an exact int in range sends the put to the
 * slow path, and the Appender checks its own state.
 */
#include "../commitlog/_native.h"

#include <structmember.h>

typedef struct {
    PyObject_HEAD
    PyObject *appender; /* an Appender (mqstore_is_appender) */
    PyObject *limits;   /* dict topic str -> partition count */
    PyObject *holder;   /* its `failure` attribute: None while puts may go on */
    PyObject *slow;     /* the Python put, for everything else */
    PyObject *help;     /* help(position): backpressure past help_past */
    long long help_past;
    long long slow_calls; /* calls handed to slow: what the tests count */
    char enabled;
} PutterObject;

static PyObject *no_bytes;   /* b"": keys and properties of the common case */
static PyObject *name_tag, *name_born, *name_keys, *name_properties, *name_failure;

static int putter_traverse(PutterObject *self, visitproc visit, void *arg) {
    Py_VISIT(self->appender);
    Py_VISIT(self->limits);
    Py_VISIT(self->holder);
    Py_VISIT(self->slow);
    Py_VISIT(self->help);
    return 0;
}

static int putter_clear(PutterObject *self) {
    Py_CLEAR(self->appender);
    Py_CLEAR(self->limits);
    Py_CLEAR(self->holder);
    Py_CLEAR(self->slow);
    Py_CLEAR(self->help);
    return 0;
}

static void putter_dealloc(PutterObject *self) {
    PyObject_GC_UnTrack(self);
    putter_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *putter_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    PyObject *appender, *limits, *holder, *slow, *help;
    static char *names[] = {"appender", "limits", "holder", "slow", "help", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO!OOO:Putter", names, &appender,
                                     &PyDict_Type, &limits, &holder, &slow, &help))
        return NULL;
    if (!mqstore_is_appender(appender)) {
        PyErr_SetString(PyExc_TypeError, "Putter: appender must be a commitlog._native.Appender");
        return NULL;
    }
    if (!PyDict_CheckExact(limits) || !PyCallable_Check(slow) || !PyCallable_Check(help)) {
        PyErr_SetString(PyExc_TypeError, "Putter: limits must be a dict, slow and help callables");
        return NULL;
    }
    PutterObject *self = (PutterObject *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    self->appender = Py_NewRef(appender);
    self->limits = Py_NewRef(limits);
    self->holder = Py_NewRef(holder);
    self->slow = Py_NewRef(slow);
    self->help = Py_NewRef(help);
    self->help_past = 0;
    self->slow_calls = 0;
    self->enabled = 0;
    return (PyObject *)self;
}

/* keys of the common case: absent, None or empty (the Python put's `not keys`, for
 * the types it takes); properties: None or an empty dict. */
static int no_keys(PyObject *keys) {
    return keys == Py_None || (PyTuple_CheckExact(keys) && PyTuple_GET_SIZE(keys) == 0) ||
           (PyList_CheckExact(keys) && PyList_GET_SIZE(keys) == 0) ||
           (PyUnicode_CheckExact(keys) && PyUnicode_GET_LENGTH(keys) == 0);
}

static int no_properties(PyObject *props) {
    return props == Py_None || (PyDict_CheckExact(props) && PyDict_GET_SIZE(props) == 0);
}

/* An exact int in [0, INT64_MAX], or -1 (anything else: the slow path decides). */
static long long small_int(PyObject *obj) {
    if (!PyLong_CheckExact(obj)) return -1;
    int overflow = 0;
    long long value = PyLong_AsLongLongAndOverflow(obj, &overflow);
    if (overflow || value < 0) return -1;
    return value;
}

/* 1: the common case, *tag and *born set (borrowed); 0: the slow path. Only names
 * given as the interned identifiers are matched: any other spelling goes slow, where
 * Python's own argument binding judges it. */
static int common_arguments(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                            PyObject **tag, PyObject **born) {
    if (nargs != 3) return 0;
    *tag = *born = Py_None;
    Py_ssize_t given = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t i = 0; i < given; i++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, i), *value = args[nargs + i];
        if (name == name_tag) {
            *tag = value;
        } else if (name == name_born) {
            *born = value;
        } else if (name == name_keys) {
            if (!no_keys(value)) return 0;
        } else if (name == name_properties) {
            if (!no_properties(value)) return 0;
        } else {
            return 0;
        }
    }
    return 1;
}

/* 1: the queue is one put may take here, 0: the slow path, -1: an error. */
static int queue_ready(PutterObject *self, PyObject *topic, PyObject *queue_id) {
    if (!PyUnicode_CheckExact(topic) || !PyDict_CheckExact(self->limits)) return 0;
    long long id = small_int(queue_id);
    if (id < 0) return 0;
    PyObject *limit = PyDict_GetItemWithError(self->limits, topic); /* borrowed */
    if (limit == NULL) return PyErr_Occurred() ? -1 : 0;
    long long count = small_int(limit);
    if (count < 0 || id >= count) return 0;
    PyObject *failure = PyObject_GetAttr(self->holder, name_failure);
    if (failure == NULL) return -1;
    int none = failure == Py_None;
    Py_DECREF(failure);
    return none;
}

static PyObject *slow_path(PutterObject *self, PyObject *const *args, Py_ssize_t nargs,
                           PyObject *kwnames) {
    self->slow_calls++;
    PyObject *slow = Py_NewRef(self->slow);
    PyObject *result = PyObject_Vectorcall(slow, args, nargs, kwnames);
    Py_DECREF(slow);
    return result;
}

static PyObject *putter_put(PutterObject *self, PyObject *const *args, Py_ssize_t nargs,
                            PyObject *kwnames) {
    if (self->slow == NULL) { /* cleared by the cyclic GC: nothing left to call */
        PyErr_SetString(PyExc_RuntimeError, "Putter: cleared");
        return NULL;
    }
    PyObject *tag, *born;
    if (!self->enabled || !common_arguments(args, nargs, kwnames, &tag, &born))
        return slow_path(self, args, nargs, kwnames);
    int ready = queue_ready(self, args[0], args[1]);
    if (ready < 0) return NULL;
    if (ready == 0) return slow_path(self, args, nargs, kwnames);
    PyObject *appender = Py_NewRef(self->appender); /* the call may run Python code */
    PyObject *argv[7] = {args[0], args[1], args[2], tag, born, no_bytes, no_bytes};
    PyObject *result = mqstore_appender_append(appender, argv);
    Py_DECREF(appender);
    if (result == NULL) return NULL;
    if (result == Py_None) { /* changed nothing: the general path's turn */
        Py_DECREF(result);
        return slow_path(self, args, nargs, kwnames);
    }
    /* An AppendResult: a tuple of 4 whose first item is the record's position. */
    PyObject *position = PyTuple_GET_ITEM(result, 0);
    if (small_int(position) > self->help_past) {
        PyObject *help = Py_NewRef(self->help);
        PyObject *helped = PyObject_CallOneArg(help, position);
        Py_DECREF(help);
        if (helped == NULL) { /* appended; the error propagates, as from the Python put */
            Py_DECREF(result);
            return NULL;
        }
        Py_DECREF(helped);
    }
    return result;
}

static PyMethodDef putter_methods[] = {
    {"put", (PyCFunction)(void (*)(void))putter_put, METH_FASTCALL | METH_KEYWORDS,
     "put($self, topic, queue_id, body, *, keys=(), tag=None, properties=None,\n"
     "    born_timestamp_ms=None)\n--\n\n"
     "Append one message: MessageStore.put in one C call (see its docstring)."},
    {NULL, NULL, 0, NULL},
};

#define PUTTER_MEMBER(name, kind, flags) {#name, kind, offsetof(PutterObject, name), flags, NULL}

static PyMemberDef putter_members[] = {
    PUTTER_MEMBER(appender, T_OBJECT, READONLY),
    PUTTER_MEMBER(limits, T_OBJECT, READONLY),
    PUTTER_MEMBER(holder, T_OBJECT, READONLY),
    PUTTER_MEMBER(slow, T_OBJECT, READONLY),
    PUTTER_MEMBER(help, T_OBJECT, READONLY),
    PUTTER_MEMBER(help_past, T_LONGLONG, 0),
    PUTTER_MEMBER(slow_calls, T_LONGLONG, READONLY),
    PUTTER_MEMBER(enabled, T_BOOL, 0),
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject PutterType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "commitlog._native.Putter",
    .tp_basicsize = sizeof(PutterObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "MessageStore.put's common case in one call (see mqstore/_put.c).",
    .tp_new = putter_new,
    .tp_dealloc = (destructor)putter_dealloc,
    .tp_traverse = (traverseproc)putter_traverse,
    .tp_clear = (inquiry)putter_clear,
    .tp_methods = putter_methods,
    .tp_members = putter_members,
};

int mqstore_add_putter_type(PyObject *m) {
    no_bytes = PyBytes_FromStringAndSize(NULL, 0);
    name_tag = PyUnicode_InternFromString("tag");
    name_born = PyUnicode_InternFromString("born_timestamp_ms");
    name_keys = PyUnicode_InternFromString("keys");
    name_properties = PyUnicode_InternFromString("properties");
    name_failure = PyUnicode_InternFromString("failure");
    if (no_bytes == NULL || name_tag == NULL || name_born == NULL || name_keys == NULL ||
        name_properties == NULL || name_failure == NULL || PyType_Ready(&PutterType) < 0)
        return -1;
    Py_INCREF(&PutterType);
    if (PyModule_AddObject(m, "Putter", (PyObject *)&PutterType) < 0) {
        Py_DECREF(&PutterType);
        return -1;
    }
    return 0;
}
