/* One compiled loop's range cut into contiguous pieces that run at once on an OpenMP team.
 *
 * Why OpenMP: torch's CPU operations run on the OpenMP threads of the libgomp torch loads,
 * and after each operation those threads spin for a while, waiting for the next one. A
 * loop handed to a thread pool of its own (Python's, open1b_kernels.core.pieces' fallback) shares
 * the cores with those spinning threads: on a 2-core machine its second half waited on a
 * core that was busy spinning, and the demo step measured no faster with two pieces than
 * with one. Built with -fopenmp and linked against the same libgomp (one runtime per
 * process: open1b_kernels.core.pieces checks), the pieces run on torch's own threads - awake,
 * with nothing else to do.
 *
 * Every loop that uses this computes a result that does not depend on the cut (its units
 * are independent, or it adds integers, or each piece writes its own partial sums), so the
 * bits are those of one piece. Without -fopenmp the pieces run one after another on the
 * calling thread: the same result.
 *
 * FOR_PIECES(lo, hi, pieces, body...) runs `body` once per non-empty piece with p_lo, p_hi
 * (its range) and piece (its index, 0 .. pieces - 1, for a piece's own scratch or partial
 * sums) in scope; [lo, hi) is cut as Python's open1b_kernels.core.pieces.parallel cuts it: pieces
 * of ceil((hi - lo) / pieces) units, the last one shorter. Call it without the GIL.
 */
#ifndef OPEN1B_PIECES_H
#define OPEN1B_PIECES_H

#ifdef _OPENMP
#include <omp.h>
#define PIECES_PARALLEL _Pragma("omp parallel num_threads(pieces_)")
#define PIECES_MEMBER omp_get_thread_num()
#define PIECES_TEAM omp_get_num_threads()
#define PIECES_OPENMP 1
#else
#define PIECES_PARALLEL
#define PIECES_MEMBER 0
#define PIECES_TEAM 1
#define PIECES_OPENMP 0
#endif

#define PIECES_MAX 4096 /* a bound on the pieces a caller may ask for (scratch per piece) */
#define PIECES_OK(n) ((n) >= 1 && (n) <= PIECES_MAX)

#define FOR_PIECES(LO, HI, PIECES, ...)                                                      \
    do {                                                                                     \
        const Py_ssize_t lo_ = (LO), hi_ = (HI);                                             \
        const int pieces_ = (PIECES) > 1 ? (PIECES) : 1;                                     \
        const Py_ssize_t step_ = (hi_ - lo_ + pieces_ - 1) / pieces_;                        \
        if (pieces_ == 1) {                                                                  \
            const Py_ssize_t p_lo = lo_, p_hi = hi_;                                         \
            const int piece = 0;                                                             \
            (void)piece;                                                                     \
            if (p_lo < p_hi) { __VA_ARGS__; }                                                \
        } else {                                                                             \
            PIECES_PARALLEL                                                                  \
            {                                                                                \
                /* a team smaller than asked for (nested, or a thread limit) still runs     \
                   every piece: each member takes every team-th one */                       \
                for (int piece = PIECES_MEMBER; piece < pieces_; piece += PIECES_TEAM) {     \
                    const Py_ssize_t p_lo = lo_ + (Py_ssize_t)piece * step_;                 \
                    const Py_ssize_t p_hi = p_lo + step_ < hi_ ? p_lo + step_ : hi_;         \
                    if (p_lo < p_hi) { __VA_ARGS__; }                                        \
                }                                                                            \
            }                                                                                \
        }                                                                                    \
    } while (0)

#endif
