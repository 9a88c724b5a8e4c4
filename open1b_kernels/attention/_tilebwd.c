/* Attention's backward on AMX tiles as one loop (open1b_kernels/attention/amx.py,
 * backward_loop): every step of compiled.py's _backward_amx - query head h of every KV group,
 * then query block qb, in that order - with its three phases (_tileamx.c: p and ds of the
 * step's tiles as digits, bwd_tiles_amx; dQ's products, dq_amx; dK's and dV's added to their
 * running sums, kv_amx), on one OpenMP team with a barrier after each phase.
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

/* Every band [lo[q], hi[q]] inside the key blocks (so inside the running sums' n_blk * 64
 * keys) and no longer than the scratch's nk_max. */
static int bands_ok(const Py_buffer *lo, const Py_buffer *hi, Py_ssize_t n_qb, Py_ssize_t n_blk,
                    Py_ssize_t nk_max) {
    if (!sized(lo, n_qb, 8, "lo") || !sized(hi, n_qb, 8, "hi")) return 0;
    const int64_t *l = lo->buf, *h = hi->buf;
    for (Py_ssize_t q = 0; q < n_qb; q++)
        if (!(0 <= l[q] && l[q] <= h[q] && h[q] < n_blk && h[q] - l[q] + 1 <= nk_max)) {
            PyErr_Format(PyExc_ValueError, "amx_backward: query block %zd's band [%lld, %lld] "
                         "outside the %zd key blocks or the scratch", q, (long long)l[q],
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
             bands_ok(&b[16], &b[17], n_qb, n_blk, nk_max) &&
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

EXT_METHODS(tilebwd) = {
    {"amx_backward", py_amx_backward, METH_VARARGS,
     "amx_backward(qd, eq, dod, edo, kd, ek, vd, ev, kc, ekc, qc, eqc, doc, edoc, lse, drow, "
     "lo, hi, dsr, erow, dsc, ecd, pc, ecp, acc_dq, acc_dk, acc_dv, BK, Hkv, G, n_blk, n_qb, D, "
     "seq, window, scale, nk_max[, pieces]): every step of attention's backward on the tiles "
     "(amx_bwd_tiles, amx_dq and amx_kv per step, in step order) in one call on one team."},
    {NULL, NULL, 0, NULL},
};
