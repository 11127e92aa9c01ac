/*
 * commitlog._native: the shared unit log's pass over a round's units (issue 15).
 *
 * runs_append(runs, new_run, queue_ids, queue_offsets, first, total) -> (count, started)
 *   SharedUnitLog.append's loop (consumequeue/shared_runs.py declares the contract and
 *   holds the pure-Python twin, runs_append_py). For each unit i < total, in order:
 *   its queue's run is runs.get(queue_ids[i]) (a SharedRun: an array of int64 record
 *   indexes with an int slot first_offset). A missing or empty run is replaced by
 *   new_run(queue_offsets[i], first + count), and started[queue id] gets what it
 *   replaced (the run, or None); a run that ends at queue_offsets[i]
 *   (first_offset + len(run)) gets first + count appended; any other unit stops the
 *   pass. Returns how many units were taken, and started.
 *   queue_ids are int32, queue_offsets int64, both at least total long; first and
 *   first + total stay in int64. A bad argument is a TypeError or ValueError before
 *   anything changes; an error from a run's own methods (a hostile run) propagates
 *   with the units before it taken, as the Python loop does.
 *
 * One C pass instead of a Python loop saves the round a few hundred ns a unit: at
 * 4,096 and 100,000 queues nearly every unit lands here (docs/QUEUES.md).
 *
 * runs_register(cls): when new_run is cls, runs_append makes its runs here: array.array's
 *   own constructor (cls's Python __new__ skipped) with the record index as the one
 *   item, both int slots set to the queue offset, and the run taken out of the cyclic GC
 *   (untracked_int_array's argument: raw int64 items and int slots make no cycle). At
 *   100,000 queues nearly every unit starts a run, and the Python call to make one was
 *   half of the pass (docs/QUEUES.md, stop 32). The caller vouches that cls(offset,
 *   position) makes just that (its own __new__ is not called). What is checked is what
 *   memory safety needs: cls is a class of metaclass type (no custom mro), a direct
 *   subclass of array.array whose only slots are first_offset and min_offset (object
 *   slots, writable), with no __dict__ and no __init__ of its own; anything else is a
 *   TypeError.
 */
#include "../commitlog/_native.h"
#include <structmember.h>

static PyObject *name_first_offset, *name_append;
static PyObject *run_type;   /* the class runs_register accepted, or NULL */
static PyObject *run_array;  /* array.array, its base (borrowed: kept for the process) */
static PyObject *run_code;   /* "q": the typecode of its items */
static Py_ssize_t run_first_at, run_min_at; /* its two slots' offsets in an instance */

/* A run of cls (run_type) at offset holding position: what cls(offset, position) makes. */
static PyObject *run_new(int64_t offset, int64_t position) {
    PyObject *item = PyBytes_FromStringAndSize((const char *)&position, 8);
    if (item == NULL) return NULL;
    PyObject *args = PyTuple_Pack(2, run_code, item);
    Py_DECREF(item);
    if (args == NULL) return NULL;
    PyObject *run = ((PyTypeObject *)run_array)->tp_new((PyTypeObject *)run_type, args, NULL);
    Py_DECREF(args);
    if (run == NULL) return NULL;
    if (Py_TYPE(run) != (PyTypeObject *)run_type || Py_SIZE(run) != 1) { /* items: ob_size */
        Py_DECREF(run);
        PyErr_SetString(PyExc_TypeError, "runs_append: the registered class made no run");
        return NULL;
    }
    PyObject *first = PyLong_FromLongLong(offset);
    if (first == NULL) {
        Py_DECREF(run);
        return NULL;
    }
    PyObject **first_slot = (PyObject **)((char *)run + run_first_at);
    PyObject **min_slot = (PyObject **)((char *)run + run_min_at);
    Py_XSETREF(*first_slot, Py_NewRef(first));
    Py_XSETREF(*min_slot, first);
    if (PyObject_GC_IsTracked(run)) PyObject_GC_UnTrack(run);
    return run;
}

/* 1: the run ends at offset (its first_offset + len == offset), 0: it does not, -1:
 * an error. */
static int run_ends_at(PyObject *run, Py_ssize_t length, int64_t offset) {
    PyObject *first;
    if (run_type != NULL && Py_TYPE(run) == (PyTypeObject *)run_type) { /* its slot */
        first = *(PyObject **)((char *)run + run_first_at);
        if (first == NULL) {
            PyErr_SetString(PyExc_AttributeError, "runs_append: a run has no first_offset");
            return -1;
        }
        Py_INCREF(first);
    } else {
        first = PyObject_GetAttr(run, name_first_offset);
        if (first == NULL) return -1;
    }
    int64_t first_offset;
    int bad = !PyLong_Check(first) || as_i64(first, &first_offset) < 0;
    Py_DECREF(first);
    if (bad) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "runs_append: a run's first_offset is not an int");
        return -1;
    }
    if (first_offset > INT64_MAX - (int64_t)length) return 0; /* never equal to an int64 */
    return first_offset + (int64_t)length == offset;
}

/* One unit: 1 taken, 0 the pass stops, -1 an error. */
static int take_unit(PyObject *runs, PyObject *new_run, PyObject *started, int32_t queue_id,
                     int64_t offset, int64_t position) {
    PyObject *key = PyLong_FromLong(queue_id);
    if (key == NULL) return -1;
    int taken = -1;
    PyObject *run = PyDict_GetItemWithError(runs, key); /* borrowed: held below */
    Py_XINCREF(run);
    Py_ssize_t length = 0;
    if (run == NULL && PyErr_Occurred()) goto done;
    if (run != NULL && run != Py_None && (length = PyObject_Length(run)) < 0) goto done;
    /* The position as an int for Python calls only: a run made in C takes it raw. */
    int in_c = run_type != NULL && new_run == run_type;
    int starts = run == NULL || run == Py_None || length == 0; /* may start anywhere */
    PyObject *at = NULL;
    if (!(starts && in_c) && (at = PyLong_FromLongLong(position)) == NULL) goto done;
    if (starts) {
        PyObject *made = in_c ? run_new(offset, position)
                              : PyObject_CallFunction(new_run, "LO", (long long)offset, at);
        if (made != NULL) {
            if (PyDict_SetItem(runs, key, made) == 0 &&
                PyDict_SetItem(started, key, run == NULL ? Py_None : run) == 0)
                taken = 1;
            Py_DECREF(made);
        }
    } else {
        int ends = run_ends_at(run, length, offset);
        if (ends <= 0) {
            taken = ends;
        } else {
            PyObject *appended = PyObject_CallMethodOneArg(run, name_append, at);
            if (appended != NULL) {
                Py_DECREF(appended);
                taken = 1;
            }
        }
    }
    Py_XDECREF(at);
done:
    Py_XDECREF(run);
    Py_DECREF(key);
    return taken;
}

PyObject *mqstore_runs_append(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "runs_append takes 6 arguments");
        return NULL;
    }
    PyObject *runs = args[0], *new_run = args[1];
    if (!PyDict_CheckExact(runs) || !PyCallable_Check(new_run)) {
        PyErr_SetString(PyExc_TypeError, "runs_append: runs must be a dict, new_run callable");
        return NULL;
    }
    int64_t first, total;
    if (as_i64(args[4], &first) < 0 || as_i64(args[5], &total) < 0) return NULL;
    Py_buffer ids, offsets;
    if (get_array(args[2], &ids, 4, 0, "queue_ids") < 0) return NULL;
    if (get_array(args[3], &offsets, 8, 0, "queue_offsets") < 0) {
        PyBuffer_Release(&ids);
        return NULL;
    }
    PyObject *result = NULL, *started = NULL;
    if (total < 0 || total > ids.len / 4 || total > offsets.len / 8 || first < 0 ||
        first > INT64_MAX - total) {
        PyErr_SetString(PyExc_ValueError, "runs_append: total or first out of range");
        goto done;
    }
    started = PyDict_New();
    if (started == NULL) goto done;
    int64_t count = 0;
    while (count < total) {
        int32_t queue_id;
        int64_t offset;
        /* Read each unit when it is taken: a run's methods may run Python code, but
         * the views keep both buffers alive and fixed in size. */
        memcpy(&queue_id, (const char *)ids.buf + count * 4, 4);
        memcpy(&offset, (const char *)offsets.buf + count * 8, 8);
        int taken = take_unit(runs, new_run, started, queue_id, offset, first + count);
        if (taken < 0) goto done;
        if (taken == 0) break;
        count++;
    }
    result = Py_BuildValue("(LO)", (long long)count, started);
done:
    Py_XDECREF(started);
    PyBuffer_Release(&offsets);
    PyBuffer_Release(&ids);
    return result;
}

/* The offset of the object slot name in cls's own members, or -1. */
static Py_ssize_t slot_at(PyTypeObject *cls, const char *name) {
    for (PyMemberDef *m = cls->tp_members; m != NULL && m->name != NULL; m++) {
        if (strcmp(m->name, name) == 0 && m->type == T_OBJECT_EX && !(m->flags & READONLY) &&
            m->offset >= (Py_ssize_t)sizeof(PyVarObject) &&
            m->offset <= cls->tp_basicsize - (Py_ssize_t)sizeof(PyObject *))
            return m->offset;
    }
    return -1;
}

static PyObject *py_runs_register(PyObject *self, PyObject *cls) {
    if (run_array == NULL && (run_array = mqstore_array_type()) == NULL) return NULL;
    /* Exactly type as metaclass: no mro() of its own, which array.array's constructor,
     * called here without tp_new_wrapper's subtype check, relies on. */
    int ok = Py_IS_TYPE(cls, &PyType_Type);
    PyTypeObject *type = (PyTypeObject *)cls;
    Py_ssize_t count = 0;
    if (ok) {
        for (PyMemberDef *m = type->tp_members; m != NULL && m->name != NULL; m++) count++;
        ok = type->tp_base == (PyTypeObject *)run_array &&
             PyType_IsSubtype(type, (PyTypeObject *)run_array) &&
             (type->tp_flags & Py_TPFLAGS_HEAPTYPE) && type->tp_dictoffset == 0 &&
             type->tp_weaklistoffset == ((PyTypeObject *)run_array)->tp_weaklistoffset &&
             type->tp_init == ((PyTypeObject *)run_array)->tp_init && count == 2;
#ifdef Py_TPFLAGS_MANAGED_DICT
        if (type->tp_flags & Py_TPFLAGS_MANAGED_DICT) ok = 0;
#endif
    }
    Py_ssize_t first_at = ok ? slot_at(type, "first_offset") : -1;
    Py_ssize_t min_at = ok ? slot_at(type, "min_offset") : -1;
    if (first_at < 0 || min_at < 0 || first_at == min_at) {
        PyErr_SetString(PyExc_TypeError,
                        "runs_register: not a direct subclass of array.array whose only "
                        "slots are first_offset and min_offset, without __dict__ or __init__");
        return NULL;
    }
    if (run_code == NULL && (run_code = PyUnicode_InternFromString("q")) == NULL) return NULL;
    run_first_at = first_at;
    run_min_at = min_at;
    Py_XSETREF(run_type, Py_NewRef(cls));
    Py_RETURN_NONE;
}

static PyMethodDef runs_methods[] = {
    {"runs_register", (PyCFunction)py_runs_register, METH_O,
     "runs_register(cls): runs_append makes cls's runs in C when new_run is cls."},
    {"runs_append", (PyCFunction)(void (*)(void))mqstore_runs_append, METH_FASTCALL,
     "runs_append(runs, new_run, queue_ids, queue_offsets, first, total) -> (count, started): "
     "SharedUnitLog.append's pass over its units (see consumequeue/shared_runs.py)."},
    {NULL, NULL, 0, NULL},
};

int mqstore_add_runs_functions(PyObject *m) {
    name_first_offset = PyUnicode_InternFromString("first_offset");
    name_append = PyUnicode_InternFromString("append");
    if (name_first_offset == NULL || name_append == NULL) return -1;
    return PyModule_AddFunctions(m, runs_methods);
}
