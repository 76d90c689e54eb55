/* A hash table from keys of three 64-bit words to a non-negative 64-bit value, for numpy arrays of keys.

   Written by hand because neither numpy nor the compiled engines at hand keep a hash table across calls: a
   recording read a piece at a time resolves the same (process, address) keys in every piece, and numpy can only
   find repeats by sorting each piece's keys again (a sort per piece costs about as much as resolving them).
   DuckDB and pyarrow join or group within one call.  This table is the memo of resolve/memo.py: a key's value is
   the name code its samples resolved to; what it misses is resolved by the numpy path (resolve/resolver.py), which
   stays the reference.

   It takes any object with the buffer protocol; every buffer is checked (one dimension, contiguous, 8-byte items,
   as long as the others) before it is read, so bad arguments raise and never read or write out of bounds.  Its size
   is bounded (MAX_ENTRIES): past it, keys are not stored and lookups of them miss. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define EMPTY (-1)
#define MAX_ENTRIES (1 << 19) /* 32 MB of slots at most */

typedef struct {
    uint64_t a, b, c;
    int64_t value; /* EMPTY: a free slot */
} Entry;

typedef struct {
    PyObject_HEAD
    Entry *slots;
    Py_ssize_t capacity; /* a power of two */
    Py_ssize_t used;
} KeyTable;

static uint64_t hash3(uint64_t a, uint64_t b, uint64_t c) {
    uint64_t h = a * 0x9E3779B97F4A7C15ULL ^ b * 0xC2B2AE3D27D4EB4FULL ^ c * 0x165667B19E3779F9ULL;
    h ^= h >> 31;
    h *= 0xBF58476D1CE4E5B9ULL;
    h ^= h >> 29;
    return h;
}

/* Item i of a checked buffer of 8-byte items (memcpy: a buffer need not be aligned). */
static uint64_t item(const Py_buffer *v, Py_ssize_t i) {
    uint64_t x;
    memcpy(&x, (const char *)v->buf + 8 * i, 8);
    return x;
}

static Entry *new_slots(Py_ssize_t capacity) {
    Entry *slots = PyMem_Malloc((size_t)capacity * sizeof(Entry));
    if (slots == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < capacity; i++)
        slots[i].value = EMPTY;
    return slots;
}

/* The slot of a key: its own, or the free one where it would go. */
static Entry *find(Entry *slots, Py_ssize_t capacity, uint64_t a, uint64_t b, uint64_t c) {
    size_t mask = (size_t)capacity - 1, i = (size_t)hash3(a, b, c) & mask;
    while (slots[i].value != EMPTY && (slots[i].a != a || slots[i].b != b || slots[i].c != c))
        i = (i + 1) & mask;
    return &slots[i];
}

static int grow(KeyTable *self) {
    Py_ssize_t capacity = self->capacity * 2;
    Entry *slots = new_slots(capacity);
    if (slots == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < self->capacity; i++) {
        Entry *e = &self->slots[i];
        if (e->value != EMPTY)
            *find(slots, capacity, e->a, e->b, e->c) = *e;
    }
    PyMem_Free(self->slots);
    self->slots = slots;
    self->capacity = capacity;
    return 0;
}

static PyObject *keytable_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    if (PyTuple_GET_SIZE(args) != 0 || (kwds != NULL && PyDict_GET_SIZE(kwds) != 0)) {
        PyErr_SetString(PyExc_TypeError, "KeyTable() takes no arguments");
        return NULL;
    }
    KeyTable *self = (KeyTable *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->capacity = 1024;
    self->used = 0;
    self->slots = new_slots(self->capacity);
    if (self->slots == NULL) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    return (PyObject *)self;
}

static void keytable_dealloc(KeyTable *self) {
    PyMem_Free(self->slots);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Buffers of the four arguments: three key columns and the values (written to by lookup), each checked. */
static int get_buffers(PyObject *args, const char *name, int writable, Py_buffer views[4]) {
    PyObject *objs[4];
    if (!PyArg_ParseTuple(args, "OOOO", &objs[0], &objs[1], &objs[2], &objs[3]))
        return -1;
    for (int i = 0; i < 4; i++) {
        int flags = PyBUF_ND | PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (i == 3 && writable ? PyBUF_WRITABLE : 0);
        if (PyObject_GetBuffer(objs[i], &views[i], flags) < 0) {
            for (int j = 0; j < i; j++)
                PyBuffer_Release(&views[j]);
            return -1;
        }
    }
    const char *problem = NULL;
    for (int i = 0; i < 4 && problem == NULL; i++) {
        const char *f = views[i].format;
        if (f != NULL && (f[0] == '<' || f[0] == '=' || f[0] == '@'))
            f++;
        if (views[i].ndim != 1 || views[i].itemsize != 8 || f == NULL || strlen(f) != 1 || strchr("qQlL", f[0]) == NULL)
            problem = "every argument must be a 1-d contiguous array of 64-bit integers";
        else if (views[i].shape[0] != views[0].shape[0])
            problem = "the arguments must be as long as each other";
    }
    if (problem != NULL) {
        for (int i = 0; i < 4; i++)
            PyBuffer_Release(&views[i]);
        PyErr_Format(PyExc_ValueError, "KeyTable.%s: %s", name, problem);
        return -1;
    }
    return 0;
}

static PyObject *keytable_lookup(KeyTable *self, PyObject *args) {
    Py_buffer v[4];
    if (get_buffers(args, "lookup", 1, v) < 0)
        return NULL;
    Py_ssize_t n = v[0].shape[0], missing = 0;
    for (Py_ssize_t i = 0; i < n; i++) { /* the GIL held: no other thread can grow the table meanwhile */
        int64_t value = find(self->slots, self->capacity, item(&v[0], i), item(&v[1], i), item(&v[2], i))->value;
        memcpy((char *)v[3].buf + 8 * i, &value, 8);
        missing += value == EMPTY;
    }
    for (int i = 0; i < 4; i++)
        PyBuffer_Release(&v[i]);
    return PyLong_FromSsize_t(missing);
}

static PyObject *keytable_insert(KeyTable *self, PyObject *args) {
    Py_buffer v[4];
    if (get_buffers(args, "insert", 0, v) < 0)
        return NULL;
    Py_ssize_t n = v[0].shape[0];
    const char *problem = NULL;
    for (Py_ssize_t i = 0; i < n && problem == NULL; i++) {
        uint64_t a = item(&v[0], i), b = item(&v[1], i), c = item(&v[2], i);
        int64_t value = (int64_t)item(&v[3], i);
        if (value < 0) {
            problem = "values must not be negative";
            break;
        }
        if (2 * (self->used + 1) > self->capacity) {
            if (self->used >= MAX_ENTRIES)
                break; /* full: the rest stay unstored, and miss */
            if (grow(self) < 0)
                break;
        }
        Entry *e = find(self->slots, self->capacity, a, b, c);
        if (e->value == EMPTY) {
            e->a = a, e->b = b, e->c = c, e->value = value;
            self->used++;
        } else if (e->value != value) {
            problem = "a key was given two values";
        }
    }
    for (int i = 0; i < 4; i++)
        PyBuffer_Release(&v[i]);
    if (PyErr_Occurred())
        return NULL;
    if (problem != NULL) {
        PyErr_Format(PyExc_ValueError, "KeyTable.insert: %s", problem);
        return NULL;
    }
    Py_RETURN_NONE;
}

/* lookup_samples(records, layout, out): lookup of the keys of sample records (memo.sample_keys' three words, made
   here from each record's fields: no key arrays).  records: the samples' bytes; layout: (record size, and the
   offsets of flags (u16), pid (u32), host_ip, guest_ip and guest_cr3 (u64)), the CR3 mask, and the flag bits of a
   guest sample, a host kernel one, a guest kernel one and a guest RIP unknown one. */
static PyObject *keytable_lookup_samples(KeyTable *self, PyObject *args) {
    Py_buffer rec, out;
    Py_ssize_t size, off_flags, off_pid, off_host, off_guest, off_cr3;
    unsigned long long cr3_mask;
    unsigned int f_guest, f_host_kernel, f_guest_kernel, f_unknown;
    if (!PyArg_ParseTuple(args, "y*(nnnnnnKIIII)w*", &rec, &size, &off_flags, &off_pid, &off_host, &off_guest,
                          &off_cr3, &cr3_mask, &f_guest, &f_host_kernel, &f_guest_kernel, &f_unknown, &out))
        return NULL;
    const char *problem = NULL;
    Py_ssize_t offsets[5] = {off_flags, off_pid, off_host, off_guest, off_cr3}, widths[5] = {2, 4, 8, 8, 8};
    if (size <= 0 || rec.len % size != 0)
        problem = "the records are not a whole number of records of that size";
    for (int i = 0; i < 5 && problem == NULL; i++)
        if (offsets[i] < 0 || offsets[i] > size - widths[i])
            problem = "a field lies outside the record";
    if (problem == NULL && out.len != 8 * (rec.len / size))
        problem = "out must hold one 64-bit integer per record";
    if (problem != NULL) {
        PyBuffer_Release(&rec);
        PyBuffer_Release(&out);
        PyErr_Format(PyExc_ValueError, "KeyTable.lookup_samples: %s", problem);
        return NULL;
    }
    Py_ssize_t n = rec.len / size, missing = 0;
    const char *r = rec.buf;
    for (Py_ssize_t i = 0; i < n; i++, r += size) {
        uint16_t flags;
        uint32_t pid;
        uint64_t ip, cr3 = 0, kind;
        memcpy(&flags, r + off_flags, 2);
        memcpy(&pid, r + off_pid, 4);
        if (flags & f_guest) {
            if (flags & f_unknown) {
                kind = 4, ip = 0;
            } else {
                kind = flags & f_guest_kernel ? 3 : 2;
                memcpy(&ip, r + off_guest, 8);
                memcpy(&cr3, r + off_cr3, 8);
                cr3 &= cr3_mask;
            }
        } else {
            kind = flags & f_host_kernel ? 1 : 0;
            memcpy(&ip, r + off_host, 8);
        }
        int64_t value = find(self->slots, self->capacity, kind << 32 | pid, ip, cr3)->value;
        memcpy((char *)out.buf + 8 * i, &value, 8);
        missing += value == EMPTY;
    }
    PyBuffer_Release(&rec);
    PyBuffer_Release(&out);
    return PyLong_FromSsize_t(missing);
}

static Py_ssize_t keytable_len(KeyTable *self) { return self->used; }

/* first(a, b, c, out): out[i] = the first position of key i's key in these arrays (a table of positions, freed
   after); returns how many keys are distinct. */
static PyObject *first(PyObject *module, PyObject *args) {
    (void)module;
    Py_buffer v[4];
    if (get_buffers(args, "first", 1, v) < 0)
        return NULL;
    Py_ssize_t n = v[0].shape[0], distinct = 0;
    size_t capacity = 16;
    while (capacity < 2 * (size_t)n)
        capacity *= 2;
    Py_ssize_t *at = PyMem_Malloc(capacity * sizeof(Py_ssize_t));
    if (at == NULL) {
        for (int i = 0; i < 4; i++)
            PyBuffer_Release(&v[i]);
        return PyErr_NoMemory();
    }
    memset(at, 0xFF, capacity * sizeof(Py_ssize_t)); /* -1: free */
    for (Py_ssize_t i = 0; i < n; i++) {
        uint64_t a = item(&v[0], i), b = item(&v[1], i), c = item(&v[2], i);
        size_t j = (size_t)hash3(a, b, c) & (capacity - 1);
        while (at[j] >= 0 && (item(&v[0], at[j]) != a || item(&v[1], at[j]) != b || item(&v[2], at[j]) != c))
            j = (j + 1) & (capacity - 1);
        if (at[j] < 0) {
            at[j] = i;
            distinct++;
        }
        int64_t pos = at[j];
        memcpy((char *)v[3].buf + 8 * i, &pos, 8);
    }
    PyMem_Free(at);
    for (int i = 0; i < 4; i++)
        PyBuffer_Release(&v[i]);
    return PyLong_FromSsize_t(distinct);
}

static PyMethodDef module_methods[] = {
    {"first", (PyCFunction)first, METH_VARARGS,
     "first(a, b, c, out): the first position of each key (a[i], b[i], c[i]) among them into out[i]; returns how "
     "many are distinct."},
    {NULL, NULL, 0, NULL},
};

static PyMethodDef keytable_methods[] = {
    {"lookup", (PyCFunction)keytable_lookup, METH_VARARGS,
     "lookup(a, b, c, out): the value of each key (a[i], b[i], c[i]) into out[i], -1 where none; returns how many "
     "missed."},
    {"lookup_samples", (PyCFunction)keytable_lookup_samples, METH_VARARGS,
     "lookup_samples(records, layout, out): lookup of the keys of sample records (see the source)."},
    {"insert", (PyCFunction)keytable_insert, METH_VARARGS,
     "insert(a, b, c, values): store each key's value (not negative; a key stored before must have the same)."},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods keytable_as_sequence = {.sq_length = (lenfunc)keytable_len};

static PyTypeObject KeyTableType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "vmprof_tui.resolve._keytable.KeyTable",
    .tp_basicsize = sizeof(KeyTable),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Keys of three 64-bit words to non-negative 64-bit values, looked up and stored an array at a time.",
    .tp_new = keytable_new,
    .tp_dealloc = (destructor)keytable_dealloc,
    .tp_methods = keytable_methods,
    .tp_as_sequence = &keytable_as_sequence,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, .m_name = "_keytable", .m_doc = "A hash table for resolve/memo.py.", .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC PyInit__keytable(void) {
    if (PyType_Ready(&KeyTableType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddIntConstant(m, "MAX_ENTRIES", MAX_ENTRIES) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&KeyTableType);
    if (PyModule_AddObject(m, "KeyTable", (PyObject *)&KeyTableType) < 0) {
        Py_DECREF(&KeyTableType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
