/* Which OpenBLAS kernels a dloco program runs: the best its CPU's feature flags
 * allow when OpenBLAS's own detection falls short, chosen before any matmul. */
#ifndef DL_KERNELS_BLAS_SELECT_H
#define DL_KERNELS_BLAS_SELECT_H

#include <stddef.h>

/* The vector class an OpenBLAS core's kernels need, lowest first. */
enum {
    DL_BLAS_LEVEL_NONE = 0,   /* "Unknown": OpenBLAS found nothing it knows */
    DL_BLAS_LEVEL_SSE = 1,    /* Prescott, Core2, Nehalem, Barcelona ... */
    DL_BLAS_LEVEL_AVX = 2,    /* Sandybridge, Bulldozer ... */
    DL_BLAS_LEVEL_AVX2 = 3,   /* Haswell, Zen, Excavator: AVX2 + FMA3 */
    DL_BLAS_LEVEL_AVX512 = 4, /* SkylakeX, Cooperlake, SapphireRapids */
};

/* The level an OpenBLAS core name (as openblas_get_corename() spells it,
 * compared without case) needs; -1 for a name this table does not know (a
 * newer OpenBLAS's core: trusted, never replaced or refused). */
int dl_blas_core_level(const char *core);
/* The table's spelling of a known core name (case-insensitive lookup), or NULL. */
const char *dl_blas_core_name(const char *core);
/* The highest level a CPU's feature flags allow; flags as /proc/cpuinfo's
 * "flags" line (space-separated: avx avx2 fma avx512f avx512bw ...). */
int dl_blas_flags_level(const char *flags);
/* The flags that made that level, e.g. "avx2 fma", into out (cap bytes). */
void dl_blas_flags_summary(const char *flags, char *out, size_t cap);

/* The selection itself, a pure function: given the CPU's flags and vendor
 * (/proc/cpuinfo's vendor_id, e.g. "GenuineIntel", "AuthenticAMD") and the
 * core OpenBLAS detected, the core to force (written to core, cap bytes) and
 * 1, or 0 when the detected core is as good as the flags allow (or unknown to
 * the table) and nothing is forced. AVX-512 -> SkylakeX; AVX2+FMA -> Zen on
 * AMD and Hygon, Haswell elsewhere; AVX -> Sandybridge. */
int dl_blas_choose(const char *flags, const char *vendor, const char *detected, char *core, size_t cap);

/* Called once at the top of a program's main() that multiplies matrices
 * (never by a library: it may re-execute the process). Consumes the option
 * --blas_core auto|CORE (or --blas_core=...) from argv (argc updated), then:
 *  - OPENBLAS_CORETYPE set by the user and --blas_core auto: kept;
 *  - --blas_core CORE: that core (refused when the CPU's flags cannot run it);
 *  - otherwise dl_blas_choose() on this CPU.
 * OpenBLAS reads its core type when it loads, before main(), so a different
 * core is applied by setting OPENBLAS_CORETYPE and re-executing
 * /proc/self/exe once, with the same argv and environment (never twice in one
 * process, never under a debugger: then it says which variable to set).
 * Writes one log line (stderr, logfmt) with the keys blas, core, detected, by
 * (auto | option | env | detected) and cpu, and a readable msg. Returns 0, or a
 * negative DL_E* code after printing why (bad --blas_core, a core the CPU
 * cannot run): the caller exits with status 2. Without OpenBLAS (another
 * cblas linked) it only consumes the option and says so. */
int dl_blas_select(int *argc, char **argv);

#endif
