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

#include "_bpe_unicode.h"

#define C_LETTER 1
#define C_NUMBER 2
#define C_SPACE 4
#define NO_RANK UINT32_MAX
#define CACHE_MAX_ENTRIES (1u << 18) /* the piece cache is dropped when it grows past this */
#define CACHE_MAX_PIECE 64          /* longer pieces are rare and mostly unique: not cached */

/* ------------------------------------------------------------------------------------- */
/* Code points of UTF-8 text (valid: it comes from PyUnicode_AsUTF8AndSize). */

static inline uint32_t decode(const uint8_t *s, Py_ssize_t i, int *len) {
    uint8_t c = s[i];
    if (c < 0x80) { *len = 1; return c; }
    if (c < 0xE0) { *len = 2; return ((uint32_t)(c & 0x1F) << 6) | (s[i + 1] & 0x3F); }
    if (c < 0xF0) {
        *len = 3;
        return ((uint32_t)(c & 0x0F) << 12) | ((uint32_t)(s[i + 1] & 0x3F) << 6) | (s[i + 2] & 0x3F);
    }
    *len = 4;
    return ((uint32_t)(c & 0x07) << 18) | ((uint32_t)(s[i + 1] & 0x3F) << 12)
           | ((uint32_t)(s[i + 2] & 0x3F) << 6) | (s[i + 3] & 0x3F);
}

static inline int cls(uint32_t cp) { return CLASS_BLOCKS[CLASS_INDEX[cp >> 8]][cp & 255]; }

typedef struct { const uint8_t *s; Py_ssize_t n; } Text;

/* Class and length of the code point at byte i (i < n). */
static inline int at(Text t, Py_ssize_t i, uint32_t *cp, int *len) {
    *cp = decode(t.s, i, len);
    return cls(*cp);
}

static inline int is_crlf(uint32_t cp) { return cp == '\r' || cp == '\n'; }

/* The lower-case ASCII letter cp folds to, or 0 (contraction letters only). */
static inline int fold(uint32_t cp) {
    if (cp == 0x17F) return 's';
    if (cp < 128 && ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z')) return (int)(cp | 0x20);
    return 0;
}

/* End (byte offset) of the piece that starts at byte p < n. */
static Py_ssize_t piece_end(Text t, Py_ssize_t p) {
    uint32_t c, d;
    int lc, ld, kc, kd;
    kc = at(t, p, &c, &lc);
    Py_ssize_t q = p + lc;

    /* 1. contractions */
    if (c == '\'' && q < t.n) {
        int f1 = fold(decode(t.s, q, &ld));
        if (f1 == 's' || f1 == 't' || f1 == 'm' || f1 == 'd') return q + ld;
        if ((f1 == 'r' || f1 == 'v' || f1 == 'l') && q + ld < t.n) {
            int l2, f2 = fold(decode(t.s, q + ld, &l2));
            if ((f1 == 'l' && f2 == 'l') || (f1 != 'l' && f2 == 'e')) return q + ld + l2;
        }
    }
    /* 2. letters, after at most one character that is not CR/LF/letter/number */
    Py_ssize_t r = -1;
    if (kc & C_LETTER) r = q;
    else if (!(kc & C_NUMBER) && !is_crlf(c) && q < t.n && (at(t, q, &d, &ld) & C_LETTER)) r = q + ld;
    if (r >= 0) {
        while (r < t.n && (at(t, r, &d, &ld) & C_LETTER)) r += ld;
        return r;
    }
    /* 3. one to three numbers */
    if (kc & C_NUMBER) {
        for (int k = 1; k < 3 && q < t.n && (at(t, q, &d, &ld) & C_NUMBER); k++) q += ld;
        return q;
    }
    /* 4. optional space, others, then CR/LF */
    r = -1;
    if (!kc) r = q; /* c itself is an "other" (not whitespace, letter or number) */
    else if (c == ' ' && q < t.n && !at(t, q, &d, &ld)) r = q + ld;
    if (r >= 0) {
        while (r < t.n && !at(t, r, &d, &ld)) r += ld;
        while (r < t.n && (t.s[r] == '\r' || t.s[r] == '\n')) r++;
        return r;
    }
    /* c is whitespace: the run [p, end), its last CR/LF and its last character */
    Py_ssize_t end = p, last_crlf = -1, last = p;
    while (end < t.n) {
        kd = at(t, end, &d, &ld);
        if (!(kd & C_SPACE)) break;
        if (is_crlf(d)) last_crlf = end;
        last = end;
        end += ld;
    }
    if (last_crlf >= 0) return last_crlf + 1;   /* 5. */
    if (end == t.n || last == p) return end;     /* 6. run ends the text; 7. one character */
    return last;                                 /* 6. all but the last character */
}

/* ------------------------------------------------------------------------------------- */
/* Open-addressing tables of byte strings: ranks (value = rank) and the piece cache
   (value = offset of the ids in `ids`, count = how many). */

typedef struct {
    uint64_t hash; /* 0 = empty */
    uint32_t off, len, value, count;
} Slot;

typedef struct {
    Slot *slots;
    size_t mask, used;
    uint8_t *keys;
    size_t keys_len, keys_cap;
} Table;

static inline uint64_t hash_bytes(const uint8_t *p, size_t n) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h | 1;
}

static int table_init(Table *t, size_t capacity) {
    size_t cap = 16;
    while (cap < capacity * 2) cap <<= 1;
    t->slots = calloc(cap, sizeof(Slot));
    t->mask = cap - 1;
    t->used = 0;
    t->keys = NULL;
    t->keys_len = t->keys_cap = 0;
    return t->slots ? 0 : -1;
}

static void table_free(Table *t) {
    free(t->slots);
    free(t->keys);
    t->slots = NULL;
    t->keys = NULL;
}

static inline Slot *table_find(const Table *t, const uint8_t *p, size_t n, uint64_t h) {
    for (size_t i = h & t->mask;; i = (i + 1) & t->mask) {
        Slot *s = &t->slots[i];
        if (!s->hash) return s; /* the empty slot where it would go */
        if (s->hash == h && s->len == n && memcmp(t->keys + s->off, p, n) == 0) return s;
    }
}

static int table_grow(Table *t) {
    Table bigger;
    if (table_init(&bigger, (t->mask + 1)) < 0) return -1;
    for (size_t i = 0; i <= t->mask; i++) {
        Slot *s = &t->slots[i];
        if (!s->hash) continue;
        size_t j = s->hash & bigger.mask;
        while (bigger.slots[j].hash) j = (j + 1) & bigger.mask;
        bigger.slots[j] = *s;
    }
    free(t->slots);
    t->slots = bigger.slots;
    t->mask = bigger.mask;
    return 0;
}

/* Insert at `s` (from table_find): copies the key. */
static int table_put(Table *t, Slot *s, const uint8_t *p, size_t n, uint64_t h, uint32_t value,
                     uint32_t count) {
    if (t->keys_len + n > t->keys_cap) {
        size_t cap = t->keys_cap ? t->keys_cap * 2 : 4096;
        while (cap < t->keys_len + n) cap *= 2;
        uint8_t *k = realloc(t->keys, cap);
        if (!k) return -1;
        t->keys = k;
        t->keys_cap = cap;
    }
    memcpy(t->keys + t->keys_len, p, n);
    s->hash = h;
    s->off = (uint32_t)t->keys_len;
    s->len = (uint32_t)n;
    s->value = value;
    s->count = count;
    t->keys_len += n;
    if (++t->used * 2 > t->mask + 1) return table_grow(t);
    return 0;
}

static inline uint32_t rank_of(const Table *ranks, const uint8_t *p, size_t n) {
    Slot *s = table_find(ranks, p, n, hash_bytes(p, n));
    return s->hash ? s->value : NO_RANK;
}

/* ------------------------------------------------------------------------------------- */
/* Growing uint32 buffers. */

typedef struct { uint32_t *v; size_t n, cap; } Ids;

static int ids_reserve(Ids *b, size_t extra) {
    if (b->n + extra <= b->cap) return 0;
    size_t cap = b->cap ? b->cap * 2 : 1024;
    while (cap < b->n + extra) cap *= 2;
    uint32_t *v = realloc(b->v, cap * sizeof(uint32_t));
    if (!v) return -1;
    b->v = v;
    b->cap = cap;
    return 0;
}

/* ------------------------------------------------------------------------------------- */
/* tiktoken's byte_pair_merge: repeatedly merge the adjacent pair of parts whose joined bytes
   have the lowest rank, the leftmost one on ties, until no joined pair has a rank. Short
   pieces: tiktoken's own array scan. Long pieces: the same merges in O(n log n), with the
   parts in a linked list and candidate merges in a heap ordered by (rank, start), so a
   100 KB run of letters takes milliseconds, not seconds. */

#define SHORT_PIECE 64

/* The ids of the `count` parts starting at starts[0..count) (starts[count] is the end). */
static int emit_parts(const Table *ranks, const uint8_t *p, const size_t *starts, size_t count,
                      Ids *out) {
    if (ids_reserve(out, count) < 0) return -1;
    for (size_t k = 0; k < count; k++) {
        uint32_t r = rank_of(ranks, p + starts[k], starts[k + 1] - starts[k]);
        if (r == NO_RANK) return -2; /* a byte with no rank: not a byte-level vocabulary */
        out->v[out->n++] = r;
    }
    return 0;
}

static int merge_short(const Table *ranks, const uint8_t *p, size_t n, Ids *out) {
    size_t start[SHORT_PIECE + 1];
    uint32_t rank[SHORT_PIECE + 1];
    size_t parts = 0;
    uint32_t min_rank = NO_RANK;
    size_t min_i = 0;
    for (size_t i = 0; i + 1 < n; i++) {
        uint32_t r = rank_of(ranks, p + i, 2);
        if (r < min_rank) { min_rank = r; min_i = i; }
        start[parts] = i;
        rank[parts++] = r;
    }
    start[parts] = n - 1; rank[parts++] = NO_RANK;
    start[parts] = n; rank[parts++] = NO_RANK;
    while (min_rank != NO_RANK) {
        size_t i = min_i;
        if (i > 0)
            rank[i - 1] = (i + 2 < parts) ? rank_of(ranks, p + start[i - 1], start[i + 2] - start[i - 1])
                                          : NO_RANK;
        rank[i] = (i + 3 < parts) ? rank_of(ranks, p + start[i], start[i + 3] - start[i]) : NO_RANK;
        memmove(start + i + 1, start + i + 2, (parts - i - 2) * sizeof(size_t));
        memmove(rank + i + 1, rank + i + 2, (parts - i - 2) * sizeof(uint32_t));
        parts--;
        min_rank = NO_RANK;
        for (size_t k = 0; k + 1 < parts; k++)
            if (rank[k] < min_rank) { min_rank = rank[k]; min_i = k; }
    }
    return emit_parts(ranks, p, start, parts - 1, out); /* the last start is the end, n */
}

typedef struct { uint32_t rank, pos, version; } Candidate;

static inline int before(Candidate a, Candidate b) {
    return a.rank < b.rank || (a.rank == b.rank && a.pos < b.pos);
}

static void heap_push(Candidate *h, size_t *size, Candidate c) {
    size_t i = (*size)++;
    while (i > 0 && before(c, h[(i - 1) / 2])) { h[i] = h[(i - 1) / 2]; i = (i - 1) / 2; }
    h[i] = c;
}

static Candidate heap_pop(Candidate *h, size_t *size) {
    Candidate top = h[0], last = h[--(*size)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *size) break;
        if (c + 1 < *size && before(h[c + 1], h[c])) c++;
        if (!before(h[c], last)) break;
        h[i] = h[c];
        i = c;
    }
    if (*size) h[i] = last;
    return top;
}

static int merge_long(const Table *ranks, const uint8_t *p, size_t n, Ids *out) {
    /* Part i (a start offset) runs to next[i]; next[i] == n for the last part.
       rank[i]: rank of joining part i and the part after it (NO_RANK for the last part). */
    uint32_t *next = malloc((n + 1) * sizeof(uint32_t));
    uint32_t *prev = malloc((n + 1) * sizeof(uint32_t));
    uint32_t *rank = malloc((n + 1) * sizeof(uint32_t));
    uint32_t *version = calloc(n + 1, sizeof(uint32_t));
    Candidate *heap = malloc((3 * n + 1) * sizeof(Candidate));
    size_t *starts = NULL;
    size_t size = 0;
    int rc = -1;
    if (!next || !prev || !rank || !version || !heap) goto done;
    for (size_t i = 0; i < n; i++) {
        next[i] = (uint32_t)(i + 1);
        prev[i] = (uint32_t)(i ? i - 1 : UINT32_MAX);
        rank[i] = (i + 1 < n) ? rank_of(ranks, p + i, 2) : NO_RANK;
        if (rank[i] != NO_RANK) heap_push(heap, &size, (Candidate){rank[i], (uint32_t)i, 0});
    }
    while (size) {
        Candidate c = heap_pop(heap, &size);
        uint32_t i = c.pos;
        if (c.version != version[i] || rank[i] != c.rank) continue; /* stale or merged away */
        uint32_t j = next[i];                                   /* merge i and j */
        next[i] = next[j];
        if (next[j] < n) prev[next[j]] = i;
        rank[j] = NO_RANK;
        version[j]++;
        rank[i] = (next[i] < n) ? rank_of(ranks, p + i, next[next[i]] - i) : NO_RANK;
        version[i]++;
        if (rank[i] != NO_RANK) heap_push(heap, &size, (Candidate){rank[i], i, version[i]});
        if (prev[i] != UINT32_MAX) {
            uint32_t h = prev[i];
            rank[h] = rank_of(ranks, p + h, next[i] - h);
            version[h]++;
            if (rank[h] != NO_RANK) heap_push(heap, &size, (Candidate){rank[h], h, version[h]});
        }
    }
    size_t parts = 0;
    starts = malloc((n + 1) * sizeof(size_t));
    if (!starts) goto done;
    for (size_t i = 0; i < n; i = next[i]) starts[parts++] = i;
    starts[parts] = n;
    rc = emit_parts(ranks, p, starts, parts, out);
done:
    free(next); free(prev); free(rank); free(version); free(heap); free(starts);
    return rc;
}

static int byte_pair_encode(const Table *ranks, const uint8_t *p, size_t n, Ids *out) {
    return n <= SHORT_PIECE ? merge_short(ranks, p, n, out) : merge_long(ranks, p, n, out);
}

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
