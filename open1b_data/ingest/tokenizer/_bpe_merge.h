/* BPE merges of one piece, as tiktoken does them.
   Part of open1b_data._bpe: included by _bpe.c only. */
#ifndef OPEN1B_BPE_MERGE_H
#define OPEN1B_BPE_MERGE_H

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

#endif
