/* open1b_kernels.ops._opsc: the ops folder's compiled loops, one file beside each op's Python:
 * _rmsnorm.c, _swiglu.c, _rope.c, _xent.c, _adamw.c, _philox.c and the LM head's
 * _lmhead_slices.c, _lmhead_sums.c, _lmhead_rowsparse.c, _lmhead_sparse.c. */
#include "../core/_ext.h"

EXT_TABLE(rmsnorm);
EXT_TABLE(swiglu);
EXT_TABLE(rope);
EXT_TABLE(xent);
EXT_TABLE(adamw);
EXT_TABLE(philox);
EXT_TABLE(lmhead_slices);
EXT_TABLE(lmhead_sums);
EXT_TABLE(lmhead_rowsparse);
EXT_TABLE(lmhead_sparse);

EXT_MODULE(_opsc, "Compiled CPU loops of open1b_kernels/ops (the torch code's bits).",
           {open1b_rmsnorm_methods, open1b_swiglu_methods, open1b_rope_methods,
            open1b_xent_methods, open1b_adamw_methods, open1b_philox_methods,
            open1b_lmhead_slices_methods, open1b_lmhead_sums_methods,
            open1b_lmhead_rowsparse_methods, open1b_lmhead_sparse_methods})
