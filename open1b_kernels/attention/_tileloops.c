/* Attention's forward and backward on AMX tiles, each as one loop on one OpenMP team
 * (open1b_kernels/attention/amx.py: forward_loop, backward_loop).
 *
 * The forward (amx_forward): compiled.py's _forward made, per query block, a call each for
 * its scores, its softmax pass, its P V and its ordered sum, four thread dispatches with a
 * barrier after each and the block's scores and P through memory in between. Every one of
 * them works on rows, and a row of the forward depends on no other row: here one unit is a
 * 16-row panel (query block, KV head, panel of the group's G * 64 rows) taken through all
 * four in turn in a team member's own scratch - scores_panel, fwd_rows32, pv_panel and
 * fwd_acc, the per-block calls' functions on the same rows, so the same bits. Units are
 * handed out dynamically, the longest bands first (a causal layer's last query blocks).
 *
 * The backward (amx_backward): every step of compiled.py's _backward_amx - query head h of
 * every KV group, then query block qb, in that order - with its three phases (_tileamx.c: p
 * and ds of the step's tiles as digits, bwd_tiles_amx; dQ's products, dq_amx; dK's and dV's
 * added to their running sums, kv_amx), with a barrier after each phase.
 *
 * Why: the same loop in Python made, per step, a call per phase (four thread dispatches),
 * sixteen buffer conversions and six scratch lookups - about 0.1 s of a windowed layer's
 * 0.34 s backward at 4,096 tokens (256 steps), measured on the AMX Xeon VM.
 *
 * The same bits: each phase's units are the per-step calls' units, each written by one
 * thread; the steps run in the same order, a barrier keeping each phase's reads after the
 * writes they need (the next step's digits overwrite the scratch the last phase reads); the
 * running sums of dK and dV are added to in step order, as before. Without OpenMP the one
 * thread runs every piece in turn: the same values. */
#include "../core/_ext.h"

#include <stdlib.h>

#include "_tileamx.h"

#ifdef _OPENMP
#define TEAM_BARRIER _Pragma("omp barrier")
#else
#define TEAM_BARRIER
#endif

#if AMX_BUILD
typedef struct {
    const int8_t *qd, *dod, *kd, *vd, *kc, *qc, *doc;
    const int32_t *eq, *edo, *ek, *ev, *ekc, *eqc, *edoc;
    const float *lse, *drow;        /* (G, n_qb, BK, 64) */
    const int64_t *lo, *hi;         /* each query block's band of key blocks */
    int8_t *dsr, *dsc, *pc;         /* one step's digits (BK, nk <= nk_max, ...) */
    int32_t *erow, *ecd, *ecp;
    float *acc_dq, *acc_dk, *acc_dv; /* (G, n_qb, BK, 64, D); (BK, D, stride) twice */
    Py_ssize_t BK, Hkv, G, n_blk, n_qb, D, stride;
    int32_t seq, window;
    float scale;
} bwd_loop;

/* Piece `piece` of `pieces` over [0, n), as FOR_PIECES cuts it. */
static int piece_of(Py_ssize_t n, int pieces, int piece, Py_ssize_t *lo, Py_ssize_t *hi) {
    Py_ssize_t step = (n + pieces - 1) / pieces;
    *lo = piece * step;
    *hi = *lo + step < n ? *lo + step : n;
    return *lo < *hi;
}

static void run_loop(const bwd_loop *L, int pieces) {
    const int pieces_ = pieces;
    Py_ssize_t dp = L->D / 16, DC = (L->D + 63) / 64, kv_units = L->BK * dp;
    PIECES_PARALLEL
    {
        const int member = PIECES_MEMBER, team = PIECES_TEAM;
        for (Py_ssize_t h = 0; h < L->G; h++)
            for (Py_ssize_t qb = 0; qb < L->n_qb; qb++) {
                Py_ssize_t first = L->lo[qb], nk = L->hi[qb] - L->lo[qb] + 1, u0, u1;
                Py_ssize_t at = (h * L->n_qb + qb) * L->BK * BLK;
                for (int p = member; p < pieces_; p += team)
                    if (piece_of(L->BK * nk, pieces_, p, &u0, &u1))
                        bwd_tiles_amx(L->qd, L->eq, L->dod, L->edo, L->kd, L->ek, L->vd, L->ev,
                                      L->lse + at, L->drow + at, L->dsr, L->erow, L->dsc, L->ecd,
                                      L->pc, L->ecp, L->Hkv, L->G, L->n_blk, h, qb, nk, first,
                                      DC, L->seq, L->window, L->scale, u0, u1);
                TEAM_BARRIER
                for (int p = member; p < pieces_; p += team)
                    if (piece_of(L->BK * 4, pieces_, p, &u0, &u1))
                        dq_amx(L->dsr, L->erow, L->kc, L->ekc, L->acc_dq + at * L->D, nk, L->D,
                               L->n_blk, first, u0, u1);
                TEAM_BARRIER
                /* dK's units then dV's: one range over both, each unit one thread's */
                for (int p = member; p < pieces_; p += team) {
                    if (!piece_of(2 * kv_units, pieces_, p, &u0, &u1)) continue;
                    if (u0 < kv_units)
                        kv_amx(L->qc, L->eqc, L->dsc, L->ecd, L->acc_dk, L->Hkv, L->G, L->n_blk,
                               h, qb, nk, L->D, L->stride, first * BLK, u0,
                               u1 < kv_units ? u1 : kv_units);
                    if (u1 > kv_units)
                        kv_amx(L->doc, L->edoc, L->pc, L->ecp, L->acc_dv, L->Hkv, L->G,
                               L->n_blk, h, qb, nk, L->D, L->stride, first * BLK,
                               (u0 > kv_units ? u0 : kv_units) - kv_units, u1 - kv_units);
                }
                TEAM_BARRIER
            }
    }
}
#endif

#if AMX_BUILD
typedef struct {
    const int8_t *qd, *kd, *vb;     /* Q's row digits (A side), K's (B side), V's codes (B) */
    const int32_t *eq, *ek, *u;     /* their exponents; u: V's row exponents (BK, S_pad) */
    const int64_t *lo, *hi;         /* each query block's band of key blocks */
    float *out, *lse;               /* (n_qb, BK, R, D), (n_qb, BK, R) */
    Py_ssize_t BK, Hkv, G, n_blk, n_qb, D, nk_max;
    int32_t seq, window;
    float scale;
} fwd_loop;

/* One team member's scratch for a panel: its scores (16 x nk * 64), P (nk x 16 x 64 int8),
 * alpha and t (16 x nk), m and l (16), the P V products (nk x 16 x D). */
typedef struct {
    float *s32, *alpha, *m, *l, *ii;
    int32_t *t;
    int8_t *p8;
    void *block;
} fwd_scratch;

static int fwd_scratch_make(fwd_scratch *w, Py_ssize_t nk_max, Py_ssize_t D) {
    Py_ssize_t f32 = 16 * nk_max * BLK + 2 * 16 * nk_max + 2 * 16 + nk_max * 16 * D;
    size_t bytes = (size_t)(f32 * 4 + nk_max * 16 * BLK);
    w->block = aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!w->block) return 0;
    w->ii = w->block;                               /* 64-byte rows first: aligned */
    w->s32 = w->ii + nk_max * 16 * D;
    w->alpha = w->s32 + 16 * nk_max * BLK;
    w->t = (int32_t *)(w->alpha + 16 * nk_max);
    w->m = (float *)(w->t + 16 * nk_max);
    w->l = w->m + 16;
    w->p8 = (int8_t *)(w->l + 16);
    return 1;
}

/* Unit `unit` of (n_qb, BK, R / 16), query blocks counted from the last: rows rr .. rr + 15
 * of KV head bk's R rows of query block qb, from their scores to their output rows. */
static void fwd_unit(const fwd_loop *L, const fwd_scratch *w, Py_ssize_t unit) {
    Py_ssize_t R = L->G * BLK, panels = R / 16, S_pad = L->n_blk * BLK;
    Py_ssize_t qb = L->n_qb - 1 - unit / (L->BK * panels), rest = unit % (L->BK * panels);
    Py_ssize_t bk = rest / panels, rr = rest % panels * 16, DC = (L->D + 63) / 64;
    Py_ssize_t first = L->lo[qb], nk = L->hi[qb] - L->lo[qb] + 1, ld = nk * BLK;
    Py_ssize_t at = (qb * L->BK + bk) * R + rr;     /* the panel's first row of out and lse */
    scores_panel(L->qd, L->eq, L->kd, L->ek, w->s32, ld, L->Hkv, L->G, L->n_blk, qb, nk, first,
                 DC, bk, rr);
    fwd_rows32(w->s32, L->u + bk * S_pad, w->p8, w->alpha, w->t, w->m, w->l, 16, nk, S_pad,
               first * BLK, qb * BLK + rr % BLK, L->seq, L->window, L->scale, 0, 16);
    for (Py_ssize_t j = 0; j < nk; j++)
        pv_panel(w->p8 + j * 16 * BLK,
                 L->vb + (bk * L->n_blk + first + j) * (L->D / 16) * 1024,
                 w->ii + j * 16 * L->D, L->D);
    fwd_acc(w->ii, w->alpha, w->t, w->m, w->l, L->out + at * L->D, L->lse + at, 16, nk, L->D,
            0, 16);
}

/* Every unit once, dynamically on the team; 0 where a member's scratch was refused (then
 * no member runs a unit: the work-sharing loop needs the whole team or none of it). */
TILE_TARGET static int run_forward(const fwd_loop *L, int pieces) {
    const int pieces_ = pieces;
    Py_ssize_t units = L->n_qb * L->BK * (L->G * BLK / 16);
    int failed = 0;
    PIECES_PARALLEL
    {
        fwd_scratch w = {0};
        int mine = fwd_scratch_make(&w, L->nk_max, L->D), stop;
        if (!mine) {
#ifdef _OPENMP
#pragma omp atomic write
#endif
            failed = 1;
        }
        TEAM_BARRIER
#ifdef _OPENMP
#pragma omp atomic read
#endif
        stop = failed;
        if (!stop) {
            amx_tiles_on();
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
            for (Py_ssize_t unit = 0; unit < units; unit++) fwd_unit(L, &w, unit);
            _tile_release();
        }
        if (mine) free(w.block);
    }
    return !failed;
}
#endif

/* Every band [lo[q], hi[q]] inside the key blocks (so inside the running sums' n_blk * 64
 * keys) and no longer than the scratch's nk_max. */
static int bands_ok(const Py_buffer *lo, const Py_buffer *hi, Py_ssize_t n_qb, Py_ssize_t n_blk,
                    Py_ssize_t nk_max, const char *name) {
    if (!sized(lo, n_qb, 8, "lo") || !sized(hi, n_qb, 8, "hi")) return 0;
    const int64_t *l = lo->buf, *h = hi->buf;
    for (Py_ssize_t q = 0; q < n_qb; q++)
        if (!(0 <= l[q] && l[q] <= h[q] && h[q] < n_blk && h[q] - l[q] + 1 <= nk_max)) {
            PyErr_Format(PyExc_ValueError, "%s: query block %zd's band [%lld, %lld] outside "
                         "the %zd key blocks or the scratch", name, q, (long long)l[q],
                         (long long)h[q], n_blk);
            return 0;
        }
    return 1;
}

static PyObject *py_amx_backward(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer b[27];
    Py_ssize_t BK, Hkv, G, n_blk, n_qb, D, seq, window, nk_max;
    double scale;
    int pieces = 1;
    if (!PyArg_ParseTuple(args, "y*y*y*y*y*y*y*y*y*y*y*y*y*y*y*y*y*y*w*w*w*w*w*w*w*w*w*"
                          "nnnnnnnndn|i", &b[0], &b[1], &b[2], &b[3], &b[4], &b[5], &b[6], &b[7],
                          &b[8], &b[9], &b[10], &b[11], &b[12], &b[13], &b[14], &b[15], &b[16],
                          &b[17], &b[18], &b[19], &b[20], &b[21], &b[22], &b[23], &b[24], &b[25],
                          &b[26], &BK, &Hkv, &G, &n_blk, &n_qb, &D, &seq, &window, &scale,
                          &nk_max, &pieces))
        return NULL;
    /* b: qd eq dod edo kd ek vd ev | kc ekc qc eqc doc edoc | lse drow lo hi |
     *    dsr erow dsc ecd pc ecp | acc_dq acc_dk acc_dv */
    Py_ssize_t DC = (D + 63) / 64, S_pad = n_blk * BLK, P = BK * G, dg = D / 16;
    Py_ssize_t stride = S_pad;      /* the running sums' keys */
    int ok = amx_ready() && BK > 0 && Hkv > 0 && BK % Hkv == 0 && G > 0 && n_qb > 0 &&
             n_qb <= n_blk && D >= 16 && D <= 256 && D % 16 == 0 && seq > 0 && seq <= S_pad &&
             window >= 0 && window < INT32_MAX && S_pad < INT32_MAX && nk_max > 0 &&
             PIECES_OK(pieces) &&
             sized(&b[0], P * n_blk * 4 * DC * DIG, 1, "qd") &&
             sized(&b[1], P * S_pad, 4, "eq") &&
             sized(&b[2], P * n_blk * 4 * DC * DIG, 1, "dod") &&
             sized(&b[3], P * S_pad, 4, "edo") &&
             sized(&b[4], BK * n_blk * 4 * DC * DIG, 1, "kd") &&
             sized(&b[5], BK * S_pad, 4, "ek") &&
             sized(&b[6], BK * n_blk * 4 * DC * DIG, 1, "vd") &&
             sized(&b[7], BK * S_pad, 4, "ev") &&
             sized(&b[8], BK * n_blk * dg * DIG, 1, "kc") &&
             sized(&b[9], BK * n_blk * D, 4, "ekc") &&
             sized(&b[10], P * n_blk * dg * DIG, 1, "qc") &&
             sized(&b[11], P * n_blk * D, 4, "eqc") &&
             sized(&b[12], P * n_blk * dg * DIG, 1, "doc") &&
             sized(&b[13], P * n_blk * D, 4, "edoc") &&
             sized(&b[14], G * n_qb * BK * BLK, 4, "lse") &&
             sized(&b[15], G * n_qb * BK * BLK, 4, "drow") &&
             bands_ok(&b[16], &b[17], n_qb, n_blk, nk_max, "amx_backward") &&
             sized(&b[18], BK * nk_max * 4 * DIG, 1, "dsr") &&
             sized(&b[19], BK * nk_max * BLK, 4, "erow") &&
             sized(&b[20], BK * nk_max * 4 * DIG, 1, "dsc") &&
             sized(&b[21], BK * nk_max * BLK, 4, "ecd") &&
             sized(&b[22], BK * nk_max * 4 * DIG, 1, "pc") &&
             sized(&b[23], BK * nk_max * BLK, 4, "ecp") &&
             sized(&b[24], G * n_qb * BK * BLK * D, 4, "acc_dq") &&
             sized(&b[25], BK * D * stride, 4, "acc_dk") &&
             sized(&b[26], BK * D * stride, 4, "acc_dv");
#if AMX_BUILD
    if (ok) {
        bwd_loop L = {b[0].buf, b[2].buf, b[4].buf, b[6].buf, b[8].buf, b[10].buf, b[12].buf,
                      b[1].buf, b[3].buf, b[5].buf, b[7].buf, b[9].buf, b[11].buf, b[13].buf,
                      b[14].buf, b[15].buf, b[16].buf, b[17].buf,
                      b[18].buf, b[20].buf, b[22].buf, b[19].buf, b[21].buf, b[23].buf,
                      b[24].buf, b[25].buf, b[26].buf,
                      BK, Hkv, G, n_blk, n_qb, D, stride, (int32_t)seq, (int32_t)window,
                      (float)scale};
        Py_BEGIN_ALLOW_THREADS
        run_loop(&L, pieces);
        Py_END_ALLOW_THREADS
    }
#else
    ok = 0;
#endif
    return finish(b, 27, ok, "amx_backward: needs AMX tiles and consistent shapes");
}

static PyObject *py_amx_forward(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer b[10];
    Py_ssize_t BK, Hkv, G, n_blk, n_qb, D, seq, window;
    double scale;
    int pieces = 1;
    if (!PyArg_ParseTuple(args, "y*y*y*y*y*y*y*y*w*w*nnnnnnnnd|i", &b[0], &b[1], &b[2], &b[3],
                          &b[4], &b[5], &b[6], &b[7], &b[8], &b[9], &BK, &Hkv, &G, &n_blk,
                          &n_qb, &D, &seq, &window, &scale, &pieces))
        return NULL;
    /* b: qd eq kd ek vb u lo hi | out lse */
    Py_ssize_t DC = (D + 63) / 64, S_pad = n_blk * BLK, P = BK * G, R = G * BLK;
    int ok = amx_ready() && BK > 0 && Hkv > 0 && BK % Hkv == 0 && G > 0 && n_qb > 0 &&
             n_qb <= n_blk && D >= 16 && D <= 256 && D % 16 == 0 && seq > 0 && seq <= S_pad &&
             window >= 0 && window < INT32_MAX && S_pad < INT32_MAX && PIECES_OK(pieces) &&
             sized(&b[0], P * n_blk * 4 * DC * DIG, 1, "qd") &&
             sized(&b[1], P * S_pad, 4, "eq") &&
             sized(&b[2], BK * n_blk * 4 * DC * DIG, 1, "kd") &&
             sized(&b[3], BK * S_pad, 4, "ek") &&
             sized(&b[4], BK * S_pad * D, 1, "vb") &&
             sized(&b[5], BK * S_pad, 4, "u") &&
             bands_ok(&b[6], &b[7], n_qb, n_blk, n_blk, "amx_forward") &&
             sized(&b[8], n_qb * BK * R * D, 4, "out") &&
             sized(&b[9], n_qb * BK * R, 4, "lse");
    int ran = 0;
#if AMX_BUILD
    if (ok) {
        Py_ssize_t nk_max = 0;
        const int64_t *lo = b[6].buf, *hi = b[7].buf;      /* the scratch's band: the longest */
        for (Py_ssize_t q = 0; q < n_qb; q++)
            nk_max = hi[q] - lo[q] + 1 > nk_max ? hi[q] - lo[q] + 1 : nk_max;
        fwd_loop L = {b[0].buf, b[2].buf, b[4].buf, b[1].buf, b[3].buf, b[5].buf, b[6].buf,
                      b[7].buf, b[8].buf, b[9].buf, BK, Hkv, G, n_blk, n_qb, D, nk_max,
                      (int32_t)seq, (int32_t)window, (float)scale};
        Py_BEGIN_ALLOW_THREADS
        ran = run_forward(&L, pieces);
        Py_END_ALLOW_THREADS
    }
#else
    ok = 0;
#endif
    if (ok && !ran) PyErr_NoMemory();        /* a team member's scratch: nothing written */
    return finish(b, 10, ok && ran, "amx_forward: needs AMX tiles and consistent shapes");
}

EXT_METHODS(tileloops) = {
    {"amx_forward", py_amx_forward, METH_VARARGS,
     "amx_forward(qd, eq, kd, ek, vb, u, lo, hi, out, lse, BK, Hkv, G, n_blk, n_qb, D, seq, "
     "window, scale[, pieces]): attention's forward on the tiles, every 16-row panel "
     "from its scores to its output rows (amx_scores, fwd_rows32, amx_pv, fwd_acc) in one call "
     "on one team."},
    {"amx_backward", py_amx_backward, METH_VARARGS,
     "amx_backward(qd, eq, dod, edo, kd, ek, vd, ev, kc, ekc, qc, eqc, doc, edoc, lse, drow, "
     "lo, hi, dsr, erow, dsc, ecd, pc, ecp, acc_dq, acc_dk, acc_dv, BK, Hkv, G, n_blk, n_qb, D, "
     "seq, window, scale, nk_max[, pieces]): every step of attention's backward on the tiles "
     "(amx_bwd_tiles, amx_dq and amx_kv per step, in step order) in one call on one team."},
    {NULL, NULL, 0, NULL},
};
