/* Tests of kernels/blas_select.c: the choice as a pure function of (cpu flags,
 * vendor, detected core), and the --blas_core option taken out of argv. */
#include "kernels/blas_select.h"

#include "core/err.h"
#include "tests/check.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

char *openblas_get_corename(void);

/* /proc/cpuinfo flags of real machines (trimmed of flags that play no part) */
#define BASE "fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat sse sse2 ht syscall nx lm pni ssse3 "
/* the Intel VM of issue 30: AVX-512 with a generic model name (OpenBLAS said Prescott) */
static const char *intel512 = BASE "fma cx16 sse4_1 sse4_2 avx f16c avx2 avx512f avx512dq avx512cd avx512bw "
                                   "avx512vl avx512_vnni";
/* this project's AMD EPYC (Zen 3) VM */
static const char *amd_zen3 = BASE "fma cx16 sse4_1 sse4_2 avx f16c bmi1 avx2 bmi2 sha_ni vaes";
/* Zen 4: AVX-512 on AMD */
static const char *amd_zen4 = BASE "fma avx avx2 avx512f avx512dq avx512cd avx512bw avx512vl avx512_bf16";
static const char *intel_avx2 = BASE "fma sse4_1 sse4_2 avx f16c avx2";
static const char *intel_avx = BASE "sse4_1 sse4_2 avx";
static const char *sse_only = BASE "sse4_1 sse4_2";
/* AVX-512 foundation without BW/VL (Knights Landing): SkylakeX kernels need both */
static const char *knl = BASE "fma avx avx2 avx512f avx512cd avx512er avx512pf";

static void expect(const char *flags, const char *vendor, const char *detected, const char *want)
{
    char core[32] = "";
    int forced = dl_blas_choose(flags, vendor, detected, core, sizeof core);
    if (want) {
        CHECK(forced == 1 && !strcmp(core, want), "detected %s on %s: want %s, got %s (%d)", detected, vendor, want, core,
              forced);
    } else {
        CHECK(forced == 0, "detected %s on %s: want it kept, got %s", detected, vendor, core);
    }
}

static void test_levels(void)
{
    CHECK_EQ(dl_blas_flags_level(intel512), DL_BLAS_LEVEL_AVX512);
    CHECK_EQ(dl_blas_flags_level(amd_zen4), DL_BLAS_LEVEL_AVX512);
    CHECK_EQ(dl_blas_flags_level(amd_zen3), DL_BLAS_LEVEL_AVX2);
    CHECK_EQ(dl_blas_flags_level(intel_avx2), DL_BLAS_LEVEL_AVX2);
    CHECK_EQ(dl_blas_flags_level(knl), DL_BLAS_LEVEL_AVX2);
    CHECK_EQ(dl_blas_flags_level(intel_avx), DL_BLAS_LEVEL_AVX);
    CHECK_EQ(dl_blas_flags_level(sse_only), DL_BLAS_LEVEL_SSE);
    CHECK_EQ(dl_blas_flags_level(""), DL_BLAS_LEVEL_NONE);
    CHECK_EQ(dl_blas_flags_level(NULL), DL_BLAS_LEVEL_NONE);
    /* whole words only: prefixes and longer names are other flags */
    CHECK_EQ(dl_blas_flags_level("pni avx avx2x fmax"), DL_BLAS_LEVEL_AVX);
    CHECK_EQ(dl_blas_flags_level("pni avx2 fma"), DL_BLAS_LEVEL_AVX2); /* avx implied, not required by name */
    CHECK_EQ(dl_blas_flags_level("\tavx2\tfma\n"), DL_BLAS_LEVEL_AVX2);
    CHECK_EQ(dl_blas_core_level("Prescott"), DL_BLAS_LEVEL_SSE);
    CHECK_EQ(dl_blas_core_level("prescott"), DL_BLAS_LEVEL_SSE);
    CHECK_EQ(dl_blas_core_level("Zen"), DL_BLAS_LEVEL_AVX2);
    CHECK_EQ(dl_blas_core_level("SKYLAKEX"), DL_BLAS_LEVEL_AVX512);
    CHECK_EQ(dl_blas_core_level("Unknown"), DL_BLAS_LEVEL_NONE);
    CHECK_EQ(dl_blas_core_level("NEOVERSEN1"), -1);
    CHECK_EQ(dl_blas_core_level(NULL), -1);
    CHECK(dl_blas_core_name("haswell") && !strcmp(dl_blas_core_name("haswell"), "Haswell"), "spelling");
    CHECK(!dl_blas_core_name("Haswel") && !dl_blas_core_name(""), "no prefix match");
    char s[64];
    dl_blas_flags_summary(intel512, s, sizeof s);
    CHECK(strstr(s, "avx512f") != NULL, "summary %s", s);
    dl_blas_flags_summary(amd_zen3, s, sizeof s);
    CHECK(!strcmp(s, "avx2 fma"), "summary %s", s);
}

static void test_choose(void)
{
    /* issue 30's case: OpenBLAS 0.3.21 detects Prescott on an AVX-512 VM */
    expect(intel512, "GenuineIntel", "Prescott", "SkylakeX");
    expect(intel512, "GenuineIntel", "Unknown", "SkylakeX");
    expect(intel512, "GenuineIntel", "Haswell", "SkylakeX");
    expect(intel512, "GenuineIntel", "prescott", "SkylakeX");
    expect(intel512, "GenuineIntel", "SkylakeX", NULL);
    expect(intel512, "GenuineIntel", "Cooperlake", NULL);
    expect(intel512, "GenuineIntel", "SapphireRapids", NULL);
    /* AVX2 machines: Zen kernels on AMD, Haswell on Intel */
    expect(amd_zen3, "AuthenticAMD", "Zen", NULL);
    expect(amd_zen3, "AuthenticAMD", "Prescott", "Zen");
    expect(amd_zen3, "AuthenticAMD", "Barcelona", "Zen");
    expect(amd_zen3, "AuthenticAMD", "Sandybridge", "Zen");
    expect(amd_zen3, "HygonGenuine", "Prescott", "Zen");
    expect(amd_zen3, "AuthenticAMD", "Excavator", NULL);
    expect(intel_avx2, "GenuineIntel", "Nehalem", "Haswell");
    expect(intel_avx2, "GenuineIntel", "Haswell", NULL);
    expect(intel_avx2, NULL, "Prescott", "Haswell");
    expect(knl, "GenuineIntel", "Prescott", "Haswell");
    /* Zen 4 reports AVX-512: OpenBLAS 0.3.21 calls it Zen */
    expect(amd_zen4, "AuthenticAMD", "Zen", "SkylakeX");
    expect(intel_avx, "GenuineIntel", "Prescott", "Sandybridge");
    expect(intel_avx, "GenuineIntel", "Sandybridge", NULL);
    /* nothing better to pick, or nothing known to compare with */
    expect(sse_only, "GenuineIntel", "Prescott", NULL);
    expect(sse_only, "GenuineIntel", "Unknown", NULL);
    expect("", "GenuineIntel", "Prescott", NULL);
    expect(intel512, "GenuineIntel", "Zen5", NULL);
    expect(intel512, "GenuineIntel", NULL, NULL);
    /* never a core above the flags */
    expect(amd_zen3, "AuthenticAMD", "SkylakeX", NULL);
    char tiny[4] = "";
    CHECK_EQ(dl_blas_choose(intel512, "GenuineIntel", "Prescott", tiny, sizeof tiny), 1);
    CHECK(strlen(tiny) == 3, "cut to the buffer: %s", tiny);
}

/* The option leaves argv for the program's own parser. OPENBLAS_CORETYPE is
 * set to the loaded core first, so no call here re-executes the test. */
static void test_option(void)
{
    setenv("OPENBLAS_CORETYPE", openblas_get_corename(), 1);
    unsetenv("DLOCO_BLAS_CHOICE");
    char *a1[] = {"prog", "--x", "1", "--blas_core", "auto", "--y", NULL};
    int n = 6;
    CHECK_EQ(dl_blas_select(&n, a1), 0);
    CHECK_EQ(n, 4);
    CHECK(!strcmp(a1[1], "--x") && !strcmp(a1[2], "1") && !strcmp(a1[3], "--y") && !a1[4], "argv %s %s %s", a1[1],
          a1[2], a1[3]);
    char *a2[] = {"prog", "--blas-core=AUTO", NULL};
    n = 2;
    CHECK_EQ(dl_blas_select(&n, a2), 0); /* names without case, as OpenBLAS reads them */
    CHECK_EQ(n, 1);
    char *a3[] = {"prog", "--blas-core=auto", "--standalone", NULL};
    n = 3;
    CHECK_EQ(dl_blas_select(&n, a3), 0);
    CHECK(n == 2 && !strcmp(a3[1], "--standalone") && !a3[2], "argv after --blas-core=auto");
    char *a4[] = {"prog", "--blas_core", NULL};
    n = 2;
    CHECK_EQ(dl_blas_select(&n, a4), DL_EINVAL);
    char *a5[] = {"prog", "--blas_core", "Pentium4", NULL};
    n = 3;
    CHECK_EQ(dl_blas_select(&n, a5), DL_EINVAL);
    char *a6[] = {"prog", "--blas_cores", "x", NULL};
    n = 3;
    CHECK_EQ(dl_blas_select(&n, a6), 0);
    CHECK_EQ(n, 3); /* another option: left alone */
    /* the core already loaded, named explicitly: nothing to re-execute */
    char core[32];
    snprintf(core, sizeof core, "%s", openblas_get_corename());
    char *a7[] = {"prog", "--blas_core", core, NULL};
    n = 3;
    if (dl_blas_core_name(core)) {
        CHECK_EQ(dl_blas_select(&n, a7), 0);
        CHECK_EQ(n, 1);
    }
    char *a8[] = {"prog", NULL};
    n = 1;
    CHECK_EQ(dl_blas_select(&n, a8), 0);
    CHECK_EQ(n, 1);
}

int main(void)
{
    test_levels();
    test_choose();
    test_option();
    printf("%d checks, %d failures\n", checks, failures);
    return failures ? 1 : 0;
}
