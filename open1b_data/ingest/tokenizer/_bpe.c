/* open1b_data._bpe: the fast encoder's compiled core - the Llama-3 split and tiktoken's BPE.

   Encoder(ranks: dict[bytes, int]) holds the mergeable ranks (rank = token id, merged
   tokens rank in merge order). Encoder.encode(text) -> bytearray of native uint32 ids;
   Encoder.split(text) -> list of piece end offsets (code points), for tests.

   Why not tiktoken alone: tiktoken runs the split pattern on fancy-regex's backtracking VM
   (the pattern holds a look-ahead) and runs BPE on every piece that is not a token, again
   for every repeat of it. Here the pattern is a hand-written state machine (below, one
   branch per alternative, in the pattern's order) and BPE results are cached per piece.
   Pieces and ids are the same: tests compare the split with HF's on every code point and
   the ids with HF and tiktoken on real text, and every build re-checks a sample of each
   shard against HF (tokenizer.check_equivalence).

   The split, for the pattern
     (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*
     |\s*[\r\n]+|\s+(?!\S)|\s+
   at position p, the first alternative that matches wins (leftmost-first):
   1. an apostrophe and a contraction, letters matched case-insensitively with Unicode
      simple case folding (so U+017F LONG S matches "s", as in both reference engines);
   2. letters, optionally after one character that is not CR/LF/letter/number;
   3. one to three numbers;
   4. an optional space, characters that are not whitespace/letters/numbers, then CR/LF;
   5. whitespace up to and including the last CR/LF of the whitespace run at p;
   6. (the run holds no CR/LF) the run if it ends the text, else the run but its last
      character when that leaves one or more - the look-ahead (?!\S);
   7. the run (a single whitespace character before a non-space).
   Character classes are Unicode 16.0 (_bpe_unicode.h, see scripts/gen_unicode_classes.py).

   The GIL is held throughout (the cache is shared state); the build runs its workers as
   processes, so encoding still runs on every core. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define C_LETTER 1
#define C_NUMBER 2
#define C_SPACE 4
#define NO_RANK UINT32_MAX
#define CACHE_MAX_ENTRIES (1u << 18) /* the piece cache is dropped when it grows past this */
#define CACHE_MAX_PIECE 64          /* longer pieces are rare and mostly unique: not cached */

#include "_bpe_split.h"
#include "_bpe_table.h"
#include "_bpe_merge.h"

/* ------------------------------------------------------------------------------------- */
/* The Python type. */

typedef struct {
    PyObject_HEAD
    Table ranks;
    Table cache;
    Ids cached; /* the cache's ids, back to back */
} Encoder;

static void cache_clear(Encoder *e) {
    table_free(&e->cache);
    e->cached.n = 0;
    table_init(&e->cache, 4096);
}

/* Append the ids of piece p[0:n] to out. */
static int encode_piece(Encoder *e, const uint8_t *p, size_t n, Ids *out) {
    uint64_t h = hash_bytes(p, n);
    Slot *s = table_find(&e->ranks, p, n, h);
    if (s->hash) {
        if (ids_reserve(out, 1) < 0) return -1;
        out->v[out->n++] = s->value;
        return 0;
    }
    if (n > CACHE_MAX_PIECE) return byte_pair_encode(&e->ranks, p, n, out);
    s = table_find(&e->cache, p, n, h);
    if (!s->hash) {
        if (e->cache.used >= CACHE_MAX_ENTRIES) {
            cache_clear(e);
            if (!e->cache.slots) return -1;
            s = table_find(&e->cache, p, n, h);
        }
        size_t first = e->cached.n;
        int rc = byte_pair_encode(&e->ranks, p, n, &e->cached);
        if (rc < 0) return rc;
        if (table_put(&e->cache, s, p, n, h, (uint32_t)first, (uint32_t)(e->cached.n - first)) < 0)
            return -1;
        s = table_find(&e->cache, p, n, h);
    }
    if (ids_reserve(out, s->count) < 0) return -1;
    memcpy(out->v + out->n, e->cached.v + s->value, s->count * sizeof(uint32_t));
    out->n += s->count;
    return 0;
}

static int Encoder_init(Encoder *self, PyObject *args, PyObject *kwds) {
    PyObject *ranks;
    static char *kwlist[] = {"ranks", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!", kwlist, &PyDict_Type, &ranks)) return -1;
    table_free(&self->ranks);
    if (table_init(&self->ranks, (size_t)PyDict_Size(ranks)) < 0) { PyErr_NoMemory(); return -1; }
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (PyDict_Next(ranks, &pos, &key, &value)) {
        char *p;
        Py_ssize_t n;
        if (PyBytes_AsStringAndSize(key, &p, &n) < 0) return -1;
        unsigned long r = PyLong_AsUnsignedLong(value);
        if (PyErr_Occurred()) return -1;
        if (n == 0 || r >= NO_RANK) {
            PyErr_Format(PyExc_ValueError, "rank %lu of a %zd-byte token is not usable", r, n);
            return -1;
        }
        uint64_t h = hash_bytes((uint8_t *)p, (size_t)n);
        Slot *s = table_find(&self->ranks, (uint8_t *)p, (size_t)n, h);
        if (table_put(&self->ranks, s, (uint8_t *)p, (size_t)n, h, (uint32_t)r, 1) < 0) {
            PyErr_NoMemory();
            return -1;
        }
    }
    for (int b = 0; b < 256; b++) {
        uint8_t byte = (uint8_t)b;
        if (rank_of(&self->ranks, &byte, 1) == NO_RANK) {
            PyErr_Format(PyExc_ValueError, "byte 0x%02x has no rank: not a byte-level vocabulary",
                         b);
            return -1;
        }
    }
    cache_clear(self);
    if (!self->cache.slots) { PyErr_NoMemory(); return -1; }
    return 0;
}

static void Encoder_dealloc(Encoder *self) {
    table_free(&self->ranks);
    table_free(&self->cache);
    free(self->cached.v);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int text_of(PyObject *arg, Text *t) {
    if (!PyUnicode_Check(arg)) {
        PyErr_Format(PyExc_TypeError, "expected str, got %s", Py_TYPE(arg)->tp_name);
        return -1;
    }
    const char *s = PyUnicode_AsUTF8AndSize(arg, &t->n); /* fails on lone surrogates */
    t->s = (const uint8_t *)s;
    return s ? 0 : -1;
}

static PyObject *Encoder_encode(Encoder *self, PyObject *arg) {
    Text t;
    if (!self->ranks.slots) return PyErr_Format(PyExc_RuntimeError, "Encoder not initialized");
    if (text_of(arg, &t) < 0) return NULL;
    Ids out = {NULL, 0, 0};
    if (ids_reserve(&out, (size_t)t.n / 3 + 16) < 0) return PyErr_NoMemory();
    for (Py_ssize_t p = 0; p < t.n;) {
        Py_ssize_t q = piece_end(t, p);
        int rc = encode_piece(self, t.s + p, (size_t)(q - p), &out);
        if (rc < 0) {
            free(out.v);
            if (rc == -2) return PyErr_Format(PyExc_ValueError, "a byte has no rank");
            return PyErr_NoMemory();
        }
        p = q;
    }
    PyObject *res = PyByteArray_FromStringAndSize((const char *)out.v,
                                                  (Py_ssize_t)(out.n * sizeof(uint32_t)));
    free(out.v);
    return res;
}

static PyObject *Encoder_split(Encoder *self, PyObject *arg) {
    (void)self; /* the split needs no ranks */
    Text t;
    if (text_of(arg, &t) < 0) return NULL;
    PyObject *ends = PyList_New(0);
    if (!ends) return NULL;
    Py_ssize_t chars = 0;
    for (Py_ssize_t p = 0; p < t.n;) {
        Py_ssize_t q = piece_end(t, p);
        for (Py_ssize_t i = p; i < q; i++) chars += (t.s[i] & 0xC0) != 0x80;
        PyObject *v = PyLong_FromSsize_t(chars);
        if (!v || PyList_Append(ends, v) < 0) { Py_XDECREF(v); Py_DECREF(ends); return NULL; }
        Py_DECREF(v);
        p = q;
    }
    return ends;
}

static PyObject *Encoder_cache_size(Encoder *self, PyObject *Py_UNUSED(ignored)) {
    return PyLong_FromSize_t(self->cache.used);
}

static PyMethodDef Encoder_methods[] = {
    {"encode", (PyCFunction)Encoder_encode, METH_O,
     "encode(text) -> bytearray of native uint32 token ids"},
    {"split", (PyCFunction)Encoder_split, METH_O,
     "split(text) -> list of piece end offsets in code points"},
    {"cache_size", (PyCFunction)Encoder_cache_size, METH_NOARGS,
     "number of pieces whose BPE result is cached"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject EncoderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "open1b_data._bpe.Encoder",
    .tp_basicsize = sizeof(Encoder),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Encoder(ranks: dict[bytes, int]): the Llama-3 split + tiktoken BPE.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Encoder_init,
    .tp_dealloc = (destructor)Encoder_dealloc,
    .tp_methods = Encoder_methods,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_bpe", "Compiled core of open1b_data.tokenizer.FastEncoder.", -1,
    NULL, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__bpe(void) {
    if (PyType_Ready(&EncoderType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    if (PyModule_AddObjectRef(m, "Encoder", (PyObject *)&EncoderType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
