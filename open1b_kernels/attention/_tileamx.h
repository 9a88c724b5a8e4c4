/* What attention's AMX files share (_tileamx.c: the tile products; _tileloops.c: the
 * forward's and the backward's loops over their steps): the block and digit geometry, the
 * forward's pieces of one 16-row panel (_tileamx.c: its scores and its P V; _tilesc.c: its
 * softmax pass and its ordered sum) and the three phases of one backward step, each over a
 * range of its units (the files that define them say what they compute). */
#ifndef OPEN1B_TILEAMX_H
#define OPEN1B_TILEAMX_H

#include "../core/_ext.h"
#include "../core/_amx.h"

#define BLK 64                   /* BLOCK_M = BLOCK_N (checked by the caller) */
#define DIG 3072                 /* one chunk's three digit blocks */

void fwd_rows32(const float *s32, const int32_t *u, int8_t *p8, float *alpha, int32_t *t,
                float *m_out, float *l_out, Py_ssize_t R, Py_ssize_t nk, Py_ssize_t ustride,
                Py_ssize_t col0, Py_ssize_t row0, int32_t seq, int32_t window, float scale,
                Py_ssize_t u0, Py_ssize_t u1);
void fwd_acc(const float *ii, const float *alpha, const int32_t *t, const float *m,
             const float *l, float *out, float *lse, Py_ssize_t R, Py_ssize_t nk, Py_ssize_t D,
             Py_ssize_t u0, Py_ssize_t u1);

#if AMX_BUILD
#define TILE_TARGET __attribute__((target("arch=x86-64-v4,amx-tile,amx-int8")))

TILE_TARGET void scores_panel(const int8_t *qd, const int32_t *eq, const int8_t *kd,
                              const int32_t *ek, float *dst, Py_ssize_t ld, Py_ssize_t Hkv,
                              Py_ssize_t G, Py_ssize_t n_blk, Py_ssize_t qb, Py_ssize_t nk,
                              Py_ssize_t first, Py_ssize_t DC, Py_ssize_t bk, Py_ssize_t rr);
TILE_TARGET void pv_panel(const int8_t *p8, const int8_t *vb, float *o, Py_ssize_t D);
TILE_TARGET void bwd_tiles_amx(const int8_t *qd, const int32_t *eq, const int8_t *dod,
                               const int32_t *edo, const int8_t *kd, const int32_t *ek,
                               const int8_t *vd, const int32_t *ev, const float *lse,
                               const float *drow, int8_t *dsr, int32_t *erow, int8_t *dsc,
                               int32_t *ecd, int8_t *pc, int32_t *ecp, Py_ssize_t Hkv,
                               Py_ssize_t G, Py_ssize_t n_blk, Py_ssize_t h, Py_ssize_t qb,
                               Py_ssize_t nk, Py_ssize_t first, Py_ssize_t DC, int32_t seq,
                               int32_t window, float scale, Py_ssize_t u0, Py_ssize_t u1);
TILE_TARGET void dq_amx(const int8_t *dsr, const int32_t *erow, const int8_t *kc,
                        const int32_t *ekc, float *out, Py_ssize_t nk, Py_ssize_t D,
                        Py_ssize_t n_blk, Py_ssize_t first, Py_ssize_t u0, Py_ssize_t u1);
TILE_TARGET void kv_amx(const int8_t *lc, const int32_t *elc, const int8_t *rc,
                        const int32_t *erc, float *acc, Py_ssize_t Hkv, Py_ssize_t G,
                        Py_ssize_t n_blk, Py_ssize_t h, Py_ssize_t qb, Py_ssize_t nk,
                        Py_ssize_t D, Py_ssize_t stride, Py_ssize_t offset, Py_ssize_t u0,
                        Py_ssize_t u1);
#endif

#endif
