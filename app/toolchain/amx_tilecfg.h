/* Included ahead of every llama.cpp source when batchyard's scripts build llama-cpp-python
 * (tests/run.sh; docs/cpu.md shows the same for pipx).
 *
 * GCC 12's <amxtileintrin.h> gives ldtilecfg and sttilecfg an 8-byte memory operand, but a
 * tile configuration is 64 bytes. The compiler then takes the stores that fill in the
 * configuration for dead and drops them, so ggml's AMX kernels load stack garbage and the
 * first matrix product of more than one row dies of a general protection fault. These macros
 * issue the same instructions with all 64 bytes as the operand. Under clang, or wherever AMX
 * is not enabled, this file does nothing.
 */
#if defined(__AMX_TILE__) && defined(__GNUC__) && !defined(__clang__)
#include <immintrin.h>
#define _tile_loadconfig(config) \
    __asm__ volatile("ldtilecfg\t%X0" ::"m"(*(const char(*)[64])(config)))
#define _tile_storeconfig(config) \
    __asm__ volatile("sttilecfg\t%X0" : "=m"(*(char(*)[64])(config)))
#endif
