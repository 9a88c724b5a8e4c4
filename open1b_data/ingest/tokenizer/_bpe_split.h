/* The Llama-3 split: the state machine described at the top of _bpe.c.
   Part of open1b_data._bpe: included by _bpe.c only. */
#ifndef OPEN1B_BPE_SPLIT_H
#define OPEN1B_BPE_SPLIT_H

#include "_bpe_unicode.h"

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

#endif
