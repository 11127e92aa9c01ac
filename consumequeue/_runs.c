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
 */
#include "../commitlog/_native.h"

static PyObject *name_first_offset, *name_append;

/* 1: the run ends at offset (its first_offset + len == offset), 0: it does not, -1:
 * an error. */
static int run_ends_at(PyObject *run, Py_ssize_t length, int64_t offset) {
    PyObject *first = PyObject_GetAttr(run, name_first_offset);
    if (first == NULL) return -1;
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
    PyObject *at = PyLong_FromLongLong(position);
    if (at == NULL) goto done;
    if (run == NULL || run == Py_None || length == 0) { /* may start anywhere */
        PyObject *made = PyObject_CallFunction(new_run, "LO", (long long)offset, at);
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
    Py_DECREF(at);
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

static PyMethodDef runs_methods[] = {
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
