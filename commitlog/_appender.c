/* The CommitLog's append path in C: AppendLock (the append lock C takes without a
 * Python call), Appender (CommitLog.append's common case in one call), Putter
 * (MessageStore.put's common case in one call, in front of an Appender; mqstore/_put.c).
 * commitlog/appender.py holds the design and the pure-Python twins. */
#include "_native.h"
#include <structmember.h>

#include <time.h>

/* ------------------------------------------------------------------ AppendLock */

/* The CommitLog's append lock (CommitLog._lock when this module is built): a plain
 * PyThread lock that Appender.append takes without a Python call, and that Python
 * takes with `with lock:` like a threading.Lock. commitlog/appender.py explains why
 * one lock covers every path that changes the append state. Not reentrant. */
typedef struct {
    PyObject_HEAD
    PyThread_type_lock lock;
    int locked; /* read and written with the GIL held, for release() and locked() */
} AppendLockObject;

static PyTypeObject AppendLockType;

/* Take the lock; the GIL is released only while waiting for another holder. */
static void append_lock_take(AppendLockObject *self) {
    if (!PyThread_acquire_lock(self->lock, NOWAIT_LOCK)) {
        Py_BEGIN_ALLOW_THREADS
        PyThread_acquire_lock(self->lock, WAIT_LOCK);
        Py_END_ALLOW_THREADS
    }
    self->locked = 1;
}

static void append_lock_give(AppendLockObject *self) {
    self->locked = 0;
    PyThread_release_lock(self->lock);
}

static PyObject *append_lock_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    if (PyTuple_GET_SIZE(args) != 0 || (kwargs != NULL && PyDict_GET_SIZE(kwargs) != 0)) {
        PyErr_SetString(PyExc_TypeError, "AppendLock() takes no arguments");
        return NULL;
    }
    AppendLockObject *self = (AppendLockObject *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    self->lock = PyThread_allocate_lock();
    self->locked = 0;
    if (self->lock == NULL) {
        Py_DECREF(self);
        PyErr_SetString(PyExc_MemoryError, "cannot allocate a lock");
        return NULL;
    }
    return (PyObject *)self;
}

static void append_lock_dealloc(AppendLockObject *self) {
    if (self->lock != NULL) {
        if (self->locked) PyThread_release_lock(self->lock);
        PyThread_free_lock(self->lock);
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *append_lock_acquire(AppendLockObject *self, PyObject *unused) {
    append_lock_take(self);
    Py_RETURN_TRUE;
}

static PyObject *append_lock_release(AppendLockObject *self, PyObject *unused) {
    if (!self->locked) {
        PyErr_SetString(PyExc_RuntimeError, "release unlocked lock");
        return NULL;
    }
    append_lock_give(self);
    Py_RETURN_NONE;
}

static PyObject *append_lock_exit(AppendLockObject *self, PyObject *const *args, Py_ssize_t n) {
    return append_lock_release(self, NULL);
}

static PyObject *append_lock_locked(AppendLockObject *self, PyObject *unused) {
    return PyBool_FromLong(self->locked);
}

static PyMethodDef append_lock_methods[] = {
    {"acquire", (PyCFunction)append_lock_acquire, METH_NOARGS, "Take the lock (blocking)."},
    {"release", (PyCFunction)append_lock_release, METH_NOARGS, "Give the lock back."},
    {"locked", (PyCFunction)append_lock_locked, METH_NOARGS, "Whether the lock is held."},
    {"__enter__", (PyCFunction)append_lock_acquire, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)(void (*)(void))append_lock_exit, METH_FASTCALL, NULL},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject AppendLockType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "commitlog._native.AppendLock",
    .tp_basicsize = sizeof(AppendLockObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The CommitLog's append lock: a non-reentrant lock C takes directly.",
    .tp_new = append_lock_new,
    .tp_dealloc = (destructor)append_lock_dealloc,
    .tp_methods = append_lock_methods,
};

/* ------------------------------------------------------------------ Appender */

/* The common case of CommitLog.append in one call: checks, queue offset, store
 * timestamp, encode and checksum, write position, the dispatcher's feed entry and the
 * append listener. commitlog/appender.py holds the design, the lock argument and the
 * pure-Python twin (PyAppender), which the tests prove writes the same bytes and
 * feed entries. append() returns None, having changed nothing, for every case it
 * leaves to CommitLog's general path: anything to validate or refuse (that path
 * raises the typed errors), a queue not in the offset table, a roll, the threshold
 * that prepares the next file, a closed or poisoned log.
 *
 * The state lives here (members below), and Python reads and sets it under the same
 * AppendLock. Nothing set from Python is trusted: the file bounds are checked on every
 * call without overflow, and the record is written only inside the mapping's buffer. */
typedef struct {
    PyObject_HEAD
    AppendLockObject *lock;
    PyObject *queue_offsets; /* dict (topic, queue_id) -> next queue offset */
    PyObject *topics;        /* dict topic str -> its validated bytes (record.py's cache) */
    PyTypeObject *result_type; /* AppendResult: a tuple subclass of 4 items, no __dict__ */
    PyObject *mapping;       /* the current file's writable buffer, or None */
    PyObject *feed;          /* the dispatcher's feed list, or None */
    PyObject *clock;         /* the store clock (ms), or None: the wall clock */
    PyObject *listener;      /* called after each append, outside the lock, or None */
    PyObject *seeds;         /* dict topic -> int64 buffer: next offset by queue id, or None */
    PyObject *seed_obj;      /* the last seed looked up, whose writable view is held, or NULL */
    Py_buffer seed_view;
    long long file_start, file_size, write_position, last_store_ts_ms, prepare_next_at;
    long long record_size_limit, feed_entries_max;
    char accepting, feed_overflow;
    char listen;      /* the listener is called only while set (1 when built) */
    char listen_once; /* set: listen is cleared before each call (the caller re-arms) */
    PyObject *last_key;      /* the (topic, queue_id) of the last call, reused */
    long long last_queue_id;
} AppenderObject;

#define APPEND_QUEUE_ID_MAX INT32_MAX /* queue_id is an i32 in the header, never < 0 */

static PyObject *empty_bytes; /* b"": the tag of untagged records in feed entries */

static int appender_traverse(AppenderObject *self, visitproc visit, void *arg) {
    Py_VISIT(self->lock);
    Py_VISIT(self->queue_offsets);
    Py_VISIT(self->topics);
    Py_VISIT(self->result_type);
    Py_VISIT(self->mapping);
    Py_VISIT(self->feed);
    Py_VISIT(self->clock);
    Py_VISIT(self->listener);
    Py_VISIT(self->seeds);
    Py_VISIT(self->seed_obj);
    Py_VISIT(self->last_key);
    return 0;
}

static void seed_release(AppenderObject *self) {
    if (self->seed_obj == NULL) return;
    PyObject *seed = self->seed_obj;
    self->seed_obj = NULL;
    PyBuffer_Release(&self->seed_view); /* drops the view's own reference */
    Py_DECREF(seed);
}

static int appender_clear(AppenderObject *self) {
    seed_release(self);
    Py_CLEAR(self->lock);
    Py_CLEAR(self->queue_offsets);
    Py_CLEAR(self->topics);
    Py_CLEAR(self->result_type);
    Py_CLEAR(self->mapping);
    Py_CLEAR(self->feed);
    Py_CLEAR(self->clock);
    Py_CLEAR(self->listener);
    Py_CLEAR(self->seeds);
    Py_CLEAR(self->last_key);
    return 0;
}

static void appender_dealloc(AppenderObject *self) {
    PyObject_GC_UnTrack(self);
    appender_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Appender(lock, queue_offsets, topics, result_type, feed_entries_max) */
static PyObject *appender_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    PyObject *lock, *queue_offsets, *topics, *result_type;
    long long feed_entries_max;
    static char *names[] = {"lock", "queue_offsets", "topics", "result_type",
                            "feed_entries_max", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!O!O!OL:Appender", names, &AppendLockType,
                                     &lock, &PyDict_Type, &queue_offsets, &PyDict_Type, &topics,
                                     &result_type, &feed_entries_max))
        return NULL;
    if (!PyDict_CheckExact(queue_offsets) || !PyDict_CheckExact(topics)) {
        PyErr_SetString(PyExc_TypeError, "queue_offsets and topics must be dicts");
        return NULL;
    }
    /* Built as tuple.__new__ builds a subclass instance: only for a plain subclass. */
    PyTypeObject *rt = (PyTypeObject *)result_type;
    if (!PyType_Check(result_type) || !PyType_IsSubtype(rt, &PyTuple_Type) ||
        rt->tp_basicsize != PyTuple_Type.tp_basicsize ||
        rt->tp_itemsize != PyTuple_Type.tp_itemsize || rt->tp_dictoffset != 0) {
        PyErr_SetString(PyExc_TypeError, "result_type must be a tuple subclass without a __dict__");
        return NULL;
    }
    if (feed_entries_max < 0) {
        PyErr_SetString(PyExc_ValueError, "feed_entries_max must be >= 0");
        return NULL;
    }
    AppenderObject *self = (AppenderObject *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    self->lock = (AppendLockObject *)Py_NewRef(lock);
    self->queue_offsets = Py_NewRef(queue_offsets);
    self->topics = Py_NewRef(topics);
    self->result_type = (PyTypeObject *)Py_NewRef(result_type);
    self->mapping = Py_NewRef(Py_None);
    self->feed = Py_NewRef(Py_None);
    self->clock = Py_NewRef(Py_None);
    self->listener = Py_NewRef(Py_None);
    self->seeds = Py_NewRef(Py_None);
    self->seed_obj = NULL;
    self->last_key = NULL;
    self->last_queue_id = -1;
    self->file_start = self->file_size = self->write_position = self->last_store_ts_ms = 0;
    self->prepare_next_at = INT64_MAX;
    self->record_size_limit = 0;
    self->feed_entries_max = feed_entries_max;
    self->accepting = self->feed_overflow = 0;
    self->listen = 1;
    self->listen_once = 0;
    return (PyObject *)self;
}

/* The sections of one record, as views (only buf and len are used by write_record). */
typedef struct {
    Py_buffer topic, tag, keys, props, body;
    uint32_t flags;
    int64_t size;
} Sections;

static inline void set_view(Py_buffer *view, const char *buf, Py_ssize_t len) {
    view->obj = NULL;
    view->buf = (void *)buf;
    view->len = len;
}

/* The argument checks of append: 1 with every section viewed (release body after), 0
 * for "the general path" (nothing to release), -1 with an exception. */
static int append_sections(AppenderObject *self, PyObject *const *args, PyObject *topic_b,
                           Sections *s) {
    PyObject *body = args[2], *tag = args[3], *keys = args[5], *props = args[6];
    set_view(&s->topic, PyBytes_AS_STRING(topic_b), PyBytes_GET_SIZE(topic_b));
    set_view(&s->keys, PyBytes_AS_STRING(keys), PyBytes_GET_SIZE(keys));
    set_view(&s->props, PyBytes_AS_STRING(props), PyBytes_GET_SIZE(props));
    set_view(&s->tag, "", 0);
    if (tag != Py_None) {
        if (!PyUnicode_CheckExact(tag)) return 0;
        Py_ssize_t tag_len;
        const char *utf8 = PyUnicode_AsUTF8AndSize(tag, &tag_len); /* cached in the str */
        if (utf8 == NULL) {
            PyErr_Clear(); /* not encodable: the general path raises the same error */
            return 0;
        }
        if (tag_len > 255) return 0;
        set_view(&s->tag, utf8, tag_len);
    }
    s->flags = 0;
    if (body == Py_None) {
        s->flags = FLAG_NULL_BODY;
        set_view(&s->body, "", 0);
    } else if (PyBytes_CheckExact(body)) {
        set_view(&s->body, PyBytes_AS_STRING(body), PyBytes_GET_SIZE(body));
    } else if (PyBytes_Check(body) || PyByteArray_Check(body)) {
        if (PyObject_GetBuffer(body, &s->body, PyBUF_SIMPLE) < 0) return -1;
    } else {
        return 0; /* memoryview and the rest: the general path checks them */
    }
    /* Each length is below 2**32 before the sum, so the sum cannot wrap. */
    if (s->keys.len > 0xFFFF || s->props.len > 0xFFFFFFFFLL || s->body.len > 0xFFFFFFFFLL) {
        release(&s->body);
        return 0;
    }
    s->size = HEADER_SIZE + s->topic.len + s->tag.len + s->keys.len + s->props.len + s->body.len;
    if (s->size > self->record_size_limit || s->size > RECORD_SIZE_MAX) {
        release(&s->body);
        return 0;
    }
    return 1;
}

/* The store clock in ms: the wall clock as time.time_ns() // 1_000_000, or clock(). */
static int append_now_ms(PyObject *clock, int64_t *out) {
    if (clock == NULL || clock == Py_None) {
        struct timespec now;
        clock_gettime(CLOCK_REALTIME, &now);
        int64_t ns = (int64_t)now.tv_sec * 1000000000LL + (int64_t)now.tv_nsec;
        *out = ns >= 0 ? ns / 1000000 : -((-ns + 999999) / 1000000); /* floor, as // */
        return 0;
    }
    PyObject *value = PyObject_CallNoArgs(clock);
    if (value == NULL) return -1;
    int64_t ms;
    int bad = as_i64(value, &ms);
    Py_DECREF(value);
    if (bad < 0) return -1;
    *out = ms;
    return 0;
}

/* The key of (topic, queue_id): the last call's when it is the same queue. */
static PyObject *append_key(AppenderObject *self, PyObject *topic, PyObject *queue_id,
                            long long queue_id_value) {
    PyObject *last = self->last_key;
    if (last != NULL && PyTuple_GET_ITEM(last, 0) == topic && self->last_queue_id == queue_id_value)
        return Py_NewRef(last);
    PyObject *key = PyTuple_Pack(2, topic, queue_id);
    if (key == NULL) return NULL;
    Py_XSETREF(self->last_key, Py_NewRef(key));
    self->last_queue_id = queue_id_value;
    return key;
}

/* What append builds under the lock, before it writes a byte (so that a failed
 * allocation leaves the log as it was). */
typedef struct {
    PyObject *position, *queue_offset, *next_offset, *stored, *size, *entry, *result;
} Built;

static void built_clear(Built *b) {
    Py_CLEAR(b->position);
    Py_CLEAR(b->queue_offset);
    Py_CLEAR(b->next_offset);
    Py_CLEAR(b->stored);
    Py_CLEAR(b->size);
    Py_CLEAR(b->entry);
    Py_CLEAR(b->result);
}

static int append_build(AppenderObject *self, Built *b, int64_t position, int64_t queue_offset,
                        int64_t stored, const Sections *s, PyObject *const *args, int with_entry,
                        int with_next) {
    b->position = PyLong_FromLongLong(position);
    b->queue_offset = PyLong_FromLongLong(queue_offset);
    /* The table's next value; a seeded queue's is written into its seed instead. */
    b->next_offset = with_next ? PyLong_FromLongLong(queue_offset + 1) : Py_NewRef(Py_None);
    b->stored = PyLong_FromLongLong(stored);
    b->size = PyLong_FromLongLong(s->size);
    if (!b->position || !b->queue_offset || !b->next_offset || !b->stored || !b->size) return -1;
    PyObject *result = self->result_type->tp_alloc(self->result_type, 4);
    if (result == NULL) return -1;
    PyTuple_SET_ITEM(result, 0, Py_NewRef(b->position));
    PyTuple_SET_ITEM(result, 1, Py_NewRef(b->queue_offset));
    PyTuple_SET_ITEM(result, 2, Py_NewRef(b->stored));
    PyTuple_SET_ITEM(result, 3, Py_NewRef(b->size));
    b->result = result;
    if (!with_entry) return 0;
    PyObject *tag_b = s->tag.len ? PyBytes_FromStringAndSize(s->tag.buf, s->tag.len)
                                 : Py_NewRef(empty_bytes);
    if (tag_b == NULL) return -1;
    PyObject *born = args[4] == Py_None ? b->stored : args[4];
    /* (position, size, topic, queue_id, queue_offset, born, stored, tag, keys) */
    b->entry = PyTuple_Pack(9, b->position, b->size, args[0], args[1], b->queue_offset, born,
                            b->stored, tag_b, args[5]);
    Py_DECREF(tag_b);
    return b->entry == NULL ? -1 : 0;
}

/* Where the record goes in the current file (-1 with ValueError when the state set
 * from Python is out of range; 0: the general path, a roll or the prepare threshold). */
static int append_place(AppenderObject *self, int64_t size, int64_t *in_file) {
    int64_t start = self->file_start, file_size = self->file_size, at = self->write_position;
    if (start < 0 || file_size < 0 || start > INT64_MAX - file_size || at < start ||
        at - start > file_size) {
        PyErr_SetString(PyExc_ValueError, "Appender: write_position outside the current file");
        return -1;
    }
    *in_file = at - start;
    if (size > file_size - *in_file - BLANK_SIZE) return 0; /* the file rolls */
    if (at + size >= self->prepare_next_at) return 0; /* no wrap: at + size < start + size */
    return 1;
}

/* The queue's slot in its topic's seed (an int64 buffer by queue id, written in place:
 * a value >= 0 is the queue's next offset, and the table has no entry for it; -1 leaves
 * the queue to the table). The last seed's writable view is kept from call to call.
 * 1 found (*slot set), 0 none (the table, then the general path), -1 error. */
static int seed_slot(AppenderObject *self, PyObject *topic, int64_t queue_id, char **slot) {
    PyObject *seeds = self->seeds;
    if (seeds == NULL || seeds == Py_None) return 0;
    if (!PyDict_CheckExact(seeds)) {
        PyErr_SetString(PyExc_TypeError, "Appender: seeds must be a dict or None");
        return -1;
    }
    PyObject *seed = PyDict_GetItemWithError(seeds, topic);
    if (seed == NULL) return PyErr_Occurred() ? -1 : 0;
    if (seed != self->seed_obj) {
        Py_buffer view;
        Py_INCREF(seed); /* GetBuffer may run code that changes seeds */
        int got = PyObject_GetBuffer(seed, &view, PyBUF_WRITABLE);
        if (got < 0) {
            Py_DECREF(seed);
            if (PyErr_ExceptionMatches(PyExc_BufferError) || /* numpy: ValueError */
                PyErr_ExceptionMatches(PyExc_TypeError) ||
                PyErr_ExceptionMatches(PyExc_ValueError)) {
                PyErr_Clear();
                PyErr_SetString(PyExc_TypeError, "Appender: a seed must be a writable buffer");
            }
            return -1;
        }
        if (view.len % 8 != 0) {
            PyBuffer_Release(&view);
            Py_DECREF(seed);
            PyErr_SetString(PyExc_ValueError, "Appender: a seed must be a buffer of int64");
            return -1;
        }
        seed_release(self);
        self->seed_obj = seed; /* the reference taken above */
        self->seed_view = view;
    }
    if (queue_id < 0 || queue_id >= self->seed_view.len / 8) return 0;
    char *at = (char *)self->seed_view.buf + queue_id * 8;
    int64_t value;
    memcpy(&value, at, 8);
    if (value < 0 || value == INT64_MAX) return 0;
    *slot = at;
    return 1;
}

/* Under the lock: 1 appended (b->result set), 0 general path, -1 error. */
static int append_locked(AppenderObject *self, PyObject *const *args, PyObject **key,
                         int64_t queue_id, const Sections *s, int64_t born, Built *b) {
    if (!self->accepting || self->mapping == NULL || self->mapping == Py_None) return 0;
    char *slot = NULL; /* the queue's offset in its topic's seed, or the table's */
    long long queue_offset = -1;
    int seeded = seed_slot(self, args[0], queue_id, &slot);
    if (seeded < 0) return -1;
    if (seeded) {
        int64_t value;
        memcpy(&value, slot, 8);
        queue_offset = value;
    } else {
        *key = append_key(self, args[0], args[1], queue_id);
        if (*key == NULL) return -1;
        PyObject *found = PyDict_GetItemWithError(self->queue_offsets, *key);
        if (found == NULL) return PyErr_Occurred() ? -1 : 0;
        int overflow = 0;
        queue_offset = PyLong_CheckExact(found) ? PyLong_AsLongLongAndOverflow(found, &overflow) : -1;
        if (overflow) return 0;
    }
    if (queue_offset < 0 || queue_offset == INT64_MAX) return 0;
    int64_t in_file;
    int place = append_place(self, s->size, &in_file);
    if (place <= 0) return place;
    int64_t position = self->write_position, now_ms;
    if (append_now_ms(self->clock, &now_ms) < 0) return -1;
    /* The clock may have run Python code: what is written below was checked above or
     * is checked against the buffer itself. */
    if (position != self->write_position) {
        PyErr_SetString(PyExc_RuntimeError, "Appender: the clock moved the write position");
        return -1;
    }
    int64_t stored = now_ms < self->last_store_ts_ms ? self->last_store_ts_ms : now_ms;
    PyObject *feed = self->feed;
    int feeding = feed != NULL && feed != Py_None && !self->feed_overflow;
    if (feeding && !PyList_CheckExact(feed)) {
        PyErr_SetString(PyExc_TypeError, "Appender: feed must be a list or None");
        return -1;
    }
    int with_entry = feeding && PyList_GET_SIZE(feed) < self->feed_entries_max;
    if (append_build(self, b, position, queue_offset, stored, s, args, with_entry, !seeded) < 0)
        return -1;
    Py_buffer out;
    if (PyObject_GetBuffer(self->mapping, &out, PyBUF_WRITABLE) < 0) {
        if (PyErr_ExceptionMatches(PyExc_BufferError)) { /* read-only: a caller's mistake */
            PyErr_Clear();
            PyErr_SetString(PyExc_TypeError, "Appender: the mapping must be a writable buffer");
        }
        return -1;
    }
    if (!slice_inside(in_file, s->size, out.len) || self->file_size > out.len) {
        PyBuffer_Release(&out);
        PyErr_SetString(PyExc_ValueError, "Appender: the mapping is shorter than the file");
        return -1;
    }
    if (seeded) { /* the clock's code, under the lock, left the seed's value as read */
        int64_t value;
        memcpy(&value, slot, 8);
        if (value != queue_offset) {
            PyBuffer_Release(&out);
            PyErr_SetString(PyExc_RuntimeError, "Appender: the clock moved the seed");
            return -1;
        }
    }
    write_record((uint8_t *)out.buf + in_file, (uint32_t)s->size, queue_offset, position,
                 born < 0 ? stored : born, stored, (int32_t)queue_id, s->flags, &s->topic, &s->tag,
                 &s->keys, &s->props, &s->body);
    PyBuffer_Release(&out);
    if (seeded) {
        int64_t next = queue_offset + 1;
        memcpy(slot, &next, 8);
    } else if (PyDict_SetItem(self->queue_offsets, *key, b->next_offset) < 0) {
        return -1; /* the key is in the table: replacing its value allocates nothing */
    }
    self->write_position = position + s->size;
    self->last_store_ts_ms = stored;
    if (feeding) {
        if (!with_entry || PyList_Append(feed, b->entry) < 0) {
            PyErr_Clear(); /* a full (or unextendable) feed: the dispatcher reads the log */
            self->feed_overflow = 1;
        }
    }
    return 1;
}

/* append(topic, queue_id, body, tag, born_ts_ms, keys, properties) -> AppendResult or
 * None. keys and properties are encoded bytes (b"" for none); see the type's comment. */
static PyObject *appender_append(AppenderObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "append takes 7 arguments");
        return NULL;
    }
    if (!PyBytes_CheckExact(args[5]) || !PyBytes_CheckExact(args[6])) {
        PyErr_SetString(PyExc_TypeError, "append: keys and properties must be encoded bytes");
        return NULL;
    }
    PyObject *topic = args[0], *queue_id_obj = args[1], *born_obj = args[4];
    if (!PyUnicode_CheckExact(topic) || !PyLong_CheckExact(queue_id_obj)) Py_RETURN_NONE;
    int overflow = 0;
    long long queue_id = PyLong_AsLongLongAndOverflow(queue_id_obj, &overflow);
    if (overflow || queue_id < 0 || queue_id > APPEND_QUEUE_ID_MAX) Py_RETURN_NONE;
    long long born = -1; /* the store timestamp */
    if (born_obj != Py_None) {
        if (!PyLong_CheckExact(born_obj)) Py_RETURN_NONE;
        born = PyLong_AsLongLongAndOverflow(born_obj, &overflow);
        if (overflow || born < 0) Py_RETURN_NONE;
    }
    PyObject *topic_b = PyDict_GetItemWithError(self->topics, topic);
    if (topic_b == NULL) {
        if (PyErr_Occurred()) return NULL;
        Py_RETURN_NONE; /* not validated yet */
    }
    if (!PyBytes_CheckExact(topic_b) || PyBytes_GET_SIZE(topic_b) < 1 ||
        PyBytes_GET_SIZE(topic_b) > 255) {
        PyErr_SetString(PyExc_ValueError, "Appender: a cached topic is not 1 to 255 bytes");
        return NULL;
    }
    Py_INCREF(topic_b); /* the clock may run Python code that empties the cache */
    Sections s;
    int ok = append_sections(self, args, topic_b, &s);
    if (ok <= 0) {
        Py_DECREF(topic_b);
        if (ok < 0) return NULL;
        Py_RETURN_NONE;
    }
    PyObject *key = NULL; /* built under the lock when the queue is not in a seed */
    Built b = {NULL, NULL, NULL, NULL, NULL, NULL, NULL};
    AppendLockObject *lock = (AppendLockObject *)Py_NewRef(self->lock);
    append_lock_take(lock);
    int done = append_locked(self, args, &key, queue_id, &s, born, &b);
    append_lock_give(lock);
    Py_DECREF(lock);
    Py_XDECREF(key);
    release(&s.body);
    Py_DECREF(topic_b);
    PyObject *result = done > 0 ? Py_NewRef(b.result) : done == 0 ? Py_NewRef(Py_None) : NULL;
    built_clear(&b);
    if (done > 0 && self->listen && self->listener != NULL && self->listener != Py_None) {
        if (self->listen_once) self->listen = 0;
        PyObject *listener = Py_NewRef(self->listener);
        PyObject *called = PyObject_CallNoArgs(listener);
        Py_DECREF(listener);
        if (called == NULL) { /* appended; the listener's error propagates */
            self->listen = 1; /* and the next append calls it again */
            Py_CLEAR(result);
        }
        Py_XDECREF(called);
    }
    return result;
}

static PyMethodDef appender_methods[] = {
    {"append", (PyCFunction)(void (*)(void))appender_append, METH_FASTCALL,
     "append(topic, queue_id, body, tag, born_ts_ms, keys, properties) -> AppendResult, or "
     "None when CommitLog's general path must do it."},
    {NULL, NULL, 0, NULL},
};

#define APPENDER_MEMBER(name, kind, flags) \
    {#name, kind, offsetof(AppenderObject, name), flags, NULL}

static PyMemberDef appender_members[] = {
    APPENDER_MEMBER(lock, T_OBJECT, READONLY),
    APPENDER_MEMBER(queue_offsets, T_OBJECT, READONLY),
    APPENDER_MEMBER(topics, T_OBJECT, READONLY),
    APPENDER_MEMBER(result_type, T_OBJECT, READONLY),
    APPENDER_MEMBER(feed_entries_max, T_LONGLONG, READONLY),
    APPENDER_MEMBER(mapping, T_OBJECT, 0),
    APPENDER_MEMBER(feed, T_OBJECT, 0),
    APPENDER_MEMBER(clock, T_OBJECT, 0),
    APPENDER_MEMBER(listener, T_OBJECT, 0),
    APPENDER_MEMBER(seeds, T_OBJECT, 0),
    APPENDER_MEMBER(file_start, T_LONGLONG, 0),
    APPENDER_MEMBER(file_size, T_LONGLONG, 0),
    APPENDER_MEMBER(write_position, T_LONGLONG, 0),
    APPENDER_MEMBER(last_store_ts_ms, T_LONGLONG, 0),
    APPENDER_MEMBER(prepare_next_at, T_LONGLONG, 0),
    APPENDER_MEMBER(record_size_limit, T_LONGLONG, 0),
    APPENDER_MEMBER(accepting, T_BOOL, 0),
    APPENDER_MEMBER(feed_overflow, T_BOOL, 0),
    APPENDER_MEMBER(listen, T_BOOL, 0),
    APPENDER_MEMBER(listen_once, T_BOOL, 0),
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject AppenderType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "commitlog._native.Appender",
    .tp_basicsize = sizeof(AppenderObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "CommitLog.append's common case in one call (see commitlog/appender.py).",
    .tp_new = appender_new,
    .tp_dealloc = (destructor)appender_dealloc,
    .tp_traverse = (traverseproc)appender_traverse,
    .tp_clear = (inquiry)appender_clear,
    .tp_methods = appender_methods,
    .tp_members = appender_members,
};

int mqstore_is_appender(PyObject *obj) { return PyObject_TypeCheck(obj, &AppenderType); }

PyObject *mqstore_appender_append(PyObject *appender, PyObject *const *args) {
    return appender_append((AppenderObject *)appender, args, 7);
}

int mqstore_add_append_types(PyObject *m) {
    empty_bytes = PyBytes_FromStringAndSize(NULL, 0);
    if (empty_bytes == NULL || PyType_Ready(&AppendLockType) < 0 ||
        PyType_Ready(&AppenderType) < 0)
        return -1;
    Py_INCREF(&AppendLockType);
    if (PyModule_AddObject(m, "AppendLock", (PyObject *)&AppendLockType) < 0) {
        Py_DECREF(&AppendLockType);
        return -1;
    }
    Py_INCREF(&AppenderType);
    if (PyModule_AddObject(m, "Appender", (PyObject *)&AppenderType) < 0) {
        Py_DECREF(&AppenderType);
        return -1;
    }
    return 0;
}
