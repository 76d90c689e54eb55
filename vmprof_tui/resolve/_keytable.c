/* A hash table from keys of three 64-bit words to a non-negative 64-bit value, for numpy arrays of keys.

   Written by hand because neither numpy nor the compiled engines at hand keep a hash table across calls: a
   recording read a piece at a time resolves the same (process, address) keys in every piece, and numpy can only
   find repeats by sorting each piece's keys again (a sort per piece costs about as much as resolving them).
   DuckDB and pyarrow join or group within one call.  This table is the memo of resolve/memo.py: a key's value is
   the name code its samples resolved to; what it misses is resolved by the numpy path (resolve/resolver.py), which
   stays the reference.

   It takes any object with the buffer protocol; every buffer is checked (one dimension, contiguous, 8-byte items,
   as long as the others) before it is read, so bad arguments raise and never read or write out of bounds.  Its size
   is bounded (MAX_ENTRIES): past it, keys are not stored and lookups of them miss.

   The addresses and CR3s of guest samples are chosen by the guest, which may be hostile: a fixed hash would let it
   pick keys that all land in one slot and make every operation walk them all.  So the hash is keyed with SEED_BYTES
   random bytes per table (os.urandom, memo.py), and no operation walks more than MAX_PROBES slots: past them a
   lookup misses (the numpy path resolves the key) and an insert is skipped.  VERSION changes with any change of
   behaviour or arguments: memo.py uses only the version it was written for. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define VERSION 2
#define EMPTY (-1)
#define MAX_ENTRIES (1 << 19) /* 32 MB of slots at most */
#define BATCH 16              /* records whose slots are fetched from memory at once (lookup_samples) */
#define MAX_PROBES 128        /* random keys at half load walk a few; only keys made to collide walk more */
#define SEED_BYTES 16

static unsigned long long probes; /* slots walked past the first, by every call: a counter for the tests */

typedef struct {
    uint64_t a, b, c;
    int64_t value; /* EMPTY: a free slot */
} Entry;

typedef struct {
    PyObject_HEAD
    Entry *slots;
    Py_ssize_t capacity; /* a power of two */
    Py_ssize_t used;
    uint64_t k0, k1; /* the seed */
} KeyTable;

/* Both halves of the 128-bit product, folded: each output bit depends on most bits of both factors. */
static uint64_t fold(uint64_t x, uint64_t y) {
    __uint128_t p = (__uint128_t)x * y;
    return (uint64_t)p ^ (uint64_t)(p >> 64);
}

/* A keyed hash (the multiply-and-fold mixing of wyhash): without the seed, which keys share a slot is unknown. */
static uint64_t hash3(uint64_t k0, uint64_t k1, uint64_t a, uint64_t b, uint64_t c) {
    uint64_t h = fold(a ^ k0, b ^ k1 ^ 0x9E3779B97F4A7C15ULL);
    h = fold(h ^ k1, c ^ k0 ^ 0xC2B2AE3D27D4EB4FULL);
    return fold(h, 0x165667B19E3779F9ULL ^ k0);
}

/* The seed: a bytes object of SEED_BYTES, into two words. */
static int parse_seed(PyObject *seed, uint64_t *k0, uint64_t *k1) {
    if (!PyBytes_Check(seed) || PyBytes_GET_SIZE(seed) != SEED_BYTES) {
        PyErr_Format(PyExc_ValueError, "the seed must be %d bytes (os.urandom)", SEED_BYTES);
        return -1;
    }
    memcpy(k0, PyBytes_AS_STRING(seed), 8);
    memcpy(k1, PyBytes_AS_STRING(seed) + 8, 8);
    return 0;
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

/* find's walk from slot i, the key's hash masked to the table (find_from: a caller that prefetched that slot). */
static Entry *find_from(Entry *slots, Py_ssize_t capacity, size_t i, uint64_t a, uint64_t b, uint64_t c) {
    size_t mask = (size_t)capacity - 1;
    for (int walked = 0; slots[i].value != EMPTY && (slots[i].a != a || slots[i].b != b || slots[i].c != c);
         walked++) {
        if (walked == MAX_PROBES)
            return NULL;
        i = (i + 1) & mask;
        probes++;
    }
    return &slots[i];
}

/* The slot of a key: its own, or the free one where it would go; NULL past MAX_PROBES slots. */
static Entry *find(const KeyTable *t, Entry *slots, Py_ssize_t capacity, uint64_t a, uint64_t b, uint64_t c) {
    return find_from(slots, capacity, (size_t)hash3(t->k0, t->k1, a, b, c) & ((size_t)capacity - 1), a, b, c);
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
        if (e->value == EMPTY)
            continue;
        Entry *to = find(self, slots, capacity, e->a, e->b, e->c);
        if (to != NULL)
            *to = *e;
        else
            self->used--; /* dropped: it misses from now on, as a key never stored */
    }
    PyMem_Free(self->slots);
    self->slots = slots;
    self->capacity = capacity;
    return 0;
}

static PyObject *keytable_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    if (PyTuple_GET_SIZE(args) != 1 || (kwds != NULL && PyDict_GET_SIZE(kwds) != 0)) {
        PyErr_SetString(PyExc_TypeError, "KeyTable(seed) takes one argument");
        return NULL;
    }
    uint64_t k0, k1;
    if (parse_seed(PyTuple_GET_ITEM(args, 0), &k0, &k1) < 0)
        return NULL;
    KeyTable *self = (KeyTable *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->k0 = k0, self->k1 = k1;
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
        Entry *e = find(self, self->slots, self->capacity, item(&v[0], i), item(&v[1], i), item(&v[2], i));
        int64_t value = e != NULL ? e->value : EMPTY;
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
    uint64_t hash[BATCH]; /* of the batch's keys, their slots fetched ahead as lookup_samples does */
    for (Py_ssize_t i = 0; i < n && problem == NULL; i++) {
        if (i % BATCH == 0) {
            for (Py_ssize_t j = i; j < n && j < i + BATCH; j++) {
                hash[j - i] = hash3(self->k0, self->k1, item(&v[0], j), item(&v[1], j), item(&v[2], j));
                __builtin_prefetch(&self->slots[hash[j - i] & ((size_t)self->capacity - 1)]);
            }
        }
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
        /* masked now: the table may have grown since the batch was hashed */
        Entry *e = find_from(self->slots, self->capacity, hash[i % BATCH] & ((size_t)self->capacity - 1), a, b, c);
        if (e == NULL) {
            continue; /* past MAX_PROBES: not stored, it misses */
        } else if (e->value == EMPTY) {
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

/* Whether two buffers share memory. */
static int overlaps(const Py_buffer *x, const Py_buffer *y) {
    const char *p = x->buf, *q = y->buf;
    return x->len > 0 && y->len > 0 && p < q + y->len && q < p + x->len;
}

/* lookup_samples(records, layout, out, a, b, c): lookup of the keys of sample records (memo.sample_keys' three
   words, made here from each record's fields: no key arrays), and the words of the keys it missed, in order, into
   a, b and c (as long as out; the first `missed` items written).  records: the samples' bytes; layout: (record
   size, and the offsets of flags (u16), pid (u32), host_ip, guest_ip and guest_cr3 (u64)), the CR3 mask, and the
   flag bits of a guest sample, a host kernel one, a guest kernel one and a guest RIP unknown one. */
static PyObject *keytable_lookup_samples(KeyTable *self, PyObject *args) {
    Py_buffer rec, out, kw[3];
    Py_ssize_t size, off_flags, off_pid, off_host, off_guest, off_cr3;
    unsigned long long cr3_mask;
    unsigned int f_guest, f_host_kernel, f_guest_kernel, f_unknown;
    if (!PyArg_ParseTuple(args, "y*(nnnnnnKIIII)w*w*w*w*", &rec, &size, &off_flags, &off_pid, &off_host,
                          &off_guest, &off_cr3, &cr3_mask, &f_guest, &f_host_kernel, &f_guest_kernel, &f_unknown, &out,
                          &kw[0], &kw[1], &kw[2]))
        return NULL;
    Py_buffer *all[5] = {&rec, &out, &kw[0], &kw[1], &kw[2]};
    const char *problem = NULL;
    Py_ssize_t offsets[5] = {off_flags, off_pid, off_host, off_guest, off_cr3}, widths[5] = {2, 4, 8, 8, 8};
    if (size <= 0 || rec.len % size != 0)
        problem = "the records are not a whole number of records of that size";
    for (int i = 0; i < 5 && problem == NULL; i++)
        if (offsets[i] < 0 || offsets[i] > size - widths[i])
            problem = "a field lies outside the record";
    if (problem == NULL && out.len != 8 * (rec.len / size))
        problem = "out must hold one 64-bit integer per record";
    for (int i = 0; i < 3 && problem == NULL; i++)
        if (kw[i].len != out.len)
            problem = "a, b and c must be as long as out";
    for (int i = 0; i < 5 && problem == NULL; i++)
        for (int j = i + 1; j < 5 && problem == NULL; j++)
            if (overlaps(all[i], all[j]))
                problem = "the records, out, a, b and c must not share memory";
    if (problem != NULL) {
        for (int i = 0; i < 5; i++)
            PyBuffer_Release(all[i]);
        PyErr_Format(PyExc_ValueError, "KeyTable.lookup_samples: %s", problem);
        return NULL;
    }
    Py_ssize_t n = rec.len / size, missing = 0;
    const char *r = rec.buf;
    size_t mask = (size_t)self->capacity - 1;
    /* A batch at a time: each record's key and slot first, asking the CPU to fetch the slots, then the walks.  A
       table of a million keys is far larger than the caches: one slot at a time, every lookup waited for memory. */
    for (Py_ssize_t start = 0; start < n; start += BATCH) {
        Py_ssize_t count = n - start < BATCH ? n - start : BATCH;
        uint64_t key[BATCH][3];
        size_t at[BATCH];
        for (Py_ssize_t j = 0; j < count; j++, r += size) {
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
            key[j][0] = kind << 32 | pid, key[j][1] = ip, key[j][2] = cr3;
            at[j] = (size_t)hash3(self->k0, self->k1, key[j][0], ip, cr3) & mask;
            __builtin_prefetch(&self->slots[at[j]]);
        }
        for (Py_ssize_t j = 0; j < count; j++) {
            Entry *e = find_from(self->slots, self->capacity, at[j], key[j][0], key[j][1], key[j][2]);
            int64_t value = e != NULL ? e->value : EMPTY;
            memcpy((char *)out.buf + 8 * (start + j), &value, 8);
            if (value == EMPTY) {
                for (int k = 0; k < 3; k++)
                    memcpy((char *)kw[k].buf + 8 * missing, &key[j][k], 8);
                missing++;
            }
        }
    }
    for (int i = 0; i < 5; i++)
        PyBuffer_Release(all[i]);
    return PyLong_FromSsize_t(missing);
}

static Py_ssize_t keytable_len(KeyTable *self) { return self->used; }

/* The seed and the buffers of first() and hashes(): (seed, a, b, c, out), out not sharing memory with a, b or c
   (first reads keys back at positions it has written). */
static int seeded_buffers(PyObject *args, const char *name, uint64_t *k0, uint64_t *k1, Py_buffer v[4]) {
    if (!PyTuple_Check(args) || PyTuple_GET_SIZE(args) != 5) {
        PyErr_Format(PyExc_TypeError, "%s(seed, a, b, c, out) takes five arguments", name);
        return -1;
    }
    if (parse_seed(PyTuple_GET_ITEM(args, 0), k0, k1) < 0)
        return -1;
    PyObject *rest = PyTuple_GetSlice(args, 1, 5);
    if (rest == NULL)
        return -1;
    int got = get_buffers(rest, name, 1, v);
    Py_DECREF(rest);
    if (got < 0)
        return -1;
    for (int i = 0; i < 3; i++) {
        if (overlaps(&v[i], &v[3])) {
            for (int j = 0; j < 4; j++)
                PyBuffer_Release(&v[j]);
            PyErr_Format(PyExc_ValueError, "%s: out must not share memory with a key array", name);
            return -1;
        }
    }
    return 0;
}

/* A call of first() or hashes(): (seed, a, b, c, out) checked, body run on them, the buffers released. */
static PyObject *seeded_call(PyObject *args, const char *name, PyObject *(*body)(uint64_t, uint64_t, Py_buffer *)) {
    Py_buffer v[4];
    uint64_t k0, k1;
    if (seeded_buffers(args, name, &k0, &k1, v) < 0)
        return NULL;
    PyObject *result = body(k0, k1, v);
    for (int i = 0; i < 4; i++)
        PyBuffer_Release(&v[i]);
    return result;
}

/* first's work: out[i] = the first position of key i's key in these arrays (a table of positions, freed after), or i
   itself where finding it would walk past MAX_PROBES slots (then the key counts as new: its samples are resolved
   again, to the same); returns how many keys are new. */
static PyObject *first_positions(uint64_t k0, uint64_t k1, Py_buffer *v) {
    Py_ssize_t n = v[0].shape[0], distinct = 0;
    size_t capacity = 16;
    while (capacity < 2 * (size_t)n)
        capacity *= 2;
    Py_ssize_t *at = PyMem_Malloc(capacity * sizeof(Py_ssize_t));
    if (at == NULL)
        return PyErr_NoMemory();
    memset(at, 0xFF, capacity * sizeof(Py_ssize_t)); /* -1: free */
    for (Py_ssize_t i = 0; i < n; i++) {
        uint64_t a = item(&v[0], i), b = item(&v[1], i), c = item(&v[2], i);
        size_t j = (size_t)hash3(k0, k1, a, b, c) & (capacity - 1);
        int walked = 0, over = 0;
        while (at[j] >= 0 && (item(&v[0], at[j]) != a || item(&v[1], at[j]) != b || item(&v[2], at[j]) != c)) {
            if (walked == MAX_PROBES) {
                over = 1;
                break;
            }
            j = (j + 1) & (capacity - 1);
            walked++;
        }
        probes += (unsigned long long)walked;
        int64_t pos = i;
        if (over) {
            distinct++;
        } else {
            if (at[j] < 0) {
                at[j] = i;
                distinct++;
            }
            pos = at[j];
        }
        memcpy((char *)v[3].buf + 8 * i, &pos, 8);
    }
    PyMem_Free(at);
    return PyLong_FromSsize_t(distinct);
}

/* hashes' work: each key's hash into out, for the tests (which keys share a slot). */
static PyObject *key_hashes(uint64_t k0, uint64_t k1, Py_buffer *v) {
    for (Py_ssize_t i = 0; i < v[0].shape[0]; i++) {
        uint64_t h = hash3(k0, k1, item(&v[0], i), item(&v[1], i), item(&v[2], i));
        memcpy((char *)v[3].buf + 8 * i, &h, 8);
    }
    Py_RETURN_NONE;
}

static PyObject *first(PyObject *module, PyObject *args) {
    (void)module;
    return seeded_call(args, "first", first_positions);
}

static PyObject *hashes(PyObject *module, PyObject *args) {
    (void)module;
    return seeded_call(args, "hashes", key_hashes);
}

static PyObject *probe_count(PyObject *module, PyObject *args) {
    (void)module, (void)args;
    return PyLong_FromUnsignedLongLong(probes);
}

static PyMethodDef module_methods[] = {
    {"first", (PyCFunction)first, METH_VARARGS,
     "first(seed, a, b, c, out): the first position of each key (a[i], b[i], c[i]) among them into out[i] (i where "
     "it would walk past MAX_PROBES slots); returns how many are new."},
    {"hashes", (PyCFunction)hashes, METH_VARARGS, "hashes(seed, a, b, c, out): each key's hash (for the tests)."},
    {"probes", (PyCFunction)probe_count, METH_NOARGS,
     "probes(): slots walked past a key's first by every call so far (for the tests)."},
    {NULL, NULL, 0, NULL},
};

static PyMethodDef keytable_methods[] = {
    {"lookup", (PyCFunction)keytable_lookup, METH_VARARGS,
     "lookup(a, b, c, out): the value of each key (a[i], b[i], c[i]) into out[i], -1 where none (or past "
     "MAX_PROBES slots); returns how many missed."},
    {"lookup_samples", (PyCFunction)keytable_lookup_samples, METH_VARARGS,
     "lookup_samples(records, layout, out, a, b, c): lookup of the keys of sample records, the missed keys' words "
     "into a, b, c (see the source); returns how many missed."},
    {"insert", (PyCFunction)keytable_insert, METH_VARARGS,
     "insert(a, b, c, values): store each key's value (not negative; a key stored before must have the same; one "
     "past MAX_PROBES slots is not stored)."},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods keytable_as_sequence = {.sq_length = (lenfunc)keytable_len};

static PyTypeObject KeyTableType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "vmprof_tui.resolve._keytable.KeyTable",
    .tp_basicsize = sizeof(KeyTable),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "KeyTable(seed): keys of three 64-bit words to non-negative 64-bit values, looked up and stored an "
              "array at a time; seed: SEED_BYTES random bytes that key its hash.",
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
    if (PyModule_AddIntConstant(m, "MAX_ENTRIES", MAX_ENTRIES) < 0 ||
        PyModule_AddIntConstant(m, "MAX_PROBES", MAX_PROBES) < 0 ||
        PyModule_AddIntConstant(m, "SEED_BYTES", SEED_BYTES) < 0 || PyModule_AddIntConstant(m, "VERSION", VERSION) < 0) {
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
