/* open1b_kernels.int8._int8c: the int8 folder's compiled loops, one file beside each module's
 * Python: _hadamard.c, _quantize.c (its STE: _ste.c), _rotrows.c, _gemm.c, _checksum.c,
 * _route.c, the pair GEMM _pairmm.c and the AMX tile GEMM _amxmm.c with its packing
 * _amxpack.c. */
#include "../core/_ext.h"

EXT_TABLE(hadamard);
EXT_TABLE(quantize);
EXT_TABLE(ste);
EXT_TABLE(rotrows);
EXT_TABLE(gemm);
EXT_TABLE(checksum);
EXT_TABLE(route);
EXT_TABLE(pairmm);
EXT_TABLE(amxmm);
EXT_TABLE(amxpack);

EXT_MODULE(_int8c, "Compiled CPU loops of open1b_kernels/int8 (exact: the torch code's bits).",
           {open1b_hadamard_methods, open1b_quantize_methods, open1b_ste_methods,
            open1b_rotrows_methods, open1b_gemm_methods, open1b_checksum_methods,
            open1b_route_methods, open1b_pairmm_methods, open1b_amxmm_methods,
            open1b_amxpack_methods})
