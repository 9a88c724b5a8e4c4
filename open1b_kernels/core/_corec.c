/* open1b_kernels.core._corec: the core folder's compiled loops - mathfn's exp and log
 * (_mathfn.c), reduce's tree (_reduce.c), rounding's bf16 sum (_rounding.c). */
#include "_ext.h"

EXT_TABLE(mathfn);
EXT_TABLE(reduce);
EXT_TABLE(rounding);

EXT_MODULE(_corec, "Compiled CPU loops of open1b_kernels/core (the torch code's bits).",
           {open1b_mathfn_methods, open1b_reduce_methods, open1b_rounding_methods})
