/* Hash tables of byte strings and growing id buffers.
   Part of open1b_data._bpe: included by _bpe.c only. */
#ifndef OPEN1B_BPE_TABLE_H
#define OPEN1B_BPE_TABLE_H

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

#endif
