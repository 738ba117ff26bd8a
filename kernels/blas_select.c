/* Chooses OpenBLAS's kernels from the CPU's feature flags before the first
 * matmul (kernels/blas_select.h): forced by OPENBLAS_CORETYPE and one re-exec. */
#include "kernels/blas_select.h"

#include "core/err.h"
#include "core/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

/* OpenBLAS's own report of the core it loaded. Weak, so a build linked
 * against another cblas still links (and this module then does nothing). */
extern char *openblas_get_corename(void) __attribute__((weak));

/* Every x86_64 core of OpenBLAS 0.3.21's DYNAMIC_ARCH table (driver/others/
 * dynamic.c), spelled as openblas_get_corename() returns it, with the vector
 * class its kernels use. */
static const struct {
    const char *name;
    int level;
} cores[] = {
    {"Unknown", DL_BLAS_LEVEL_NONE},       {"Katmai", DL_BLAS_LEVEL_SSE},        {"Coppermine", DL_BLAS_LEVEL_SSE},
    {"Northwood", DL_BLAS_LEVEL_SSE},      {"Prescott", DL_BLAS_LEVEL_SSE},      {"Banias", DL_BLAS_LEVEL_SSE},
    {"Atom", DL_BLAS_LEVEL_SSE},           {"Core2", DL_BLAS_LEVEL_SSE},         {"Penryn", DL_BLAS_LEVEL_SSE},
    {"Dunnington", DL_BLAS_LEVEL_SSE},     {"Nehalem", DL_BLAS_LEVEL_SSE},       {"Athlon", DL_BLAS_LEVEL_SSE},
    {"Opteron", DL_BLAS_LEVEL_SSE},        {"Opteron_SSE3", DL_BLAS_LEVEL_SSE},  {"Barcelona", DL_BLAS_LEVEL_SSE},
    {"Nano", DL_BLAS_LEVEL_SSE},           {"Bobcat", DL_BLAS_LEVEL_SSE},        {"Sandybridge", DL_BLAS_LEVEL_AVX},
    {"Bulldozer", DL_BLAS_LEVEL_AVX},      {"Piledriver", DL_BLAS_LEVEL_AVX},    {"Steamroller", DL_BLAS_LEVEL_AVX},
    {"Haswell", DL_BLAS_LEVEL_AVX2},       {"Excavator", DL_BLAS_LEVEL_AVX2},    {"Zen", DL_BLAS_LEVEL_AVX2},
    {"SkylakeX", DL_BLAS_LEVEL_AVX512},    {"Cooperlake", DL_BLAS_LEVEL_AVX512}, {"SapphireRapids", DL_BLAS_LEVEL_AVX512},
};
#define NCORES (sizeof cores / sizeof cores[0])

/* What each level needs from the flags: all of them (AVX-512: the subsets
 * OpenBLAS's SkylakeX kernels use). */
static const char *const level_flags[] = {
    [DL_BLAS_LEVEL_NONE] = "",
    [DL_BLAS_LEVEL_SSE] = "",
    [DL_BLAS_LEVEL_AVX] = "avx",
    [DL_BLAS_LEVEL_AVX2] = "avx2 fma",
    [DL_BLAS_LEVEL_AVX512] = "avx512f avx512bw avx512vl avx512dq avx512cd",
};

const char *dl_blas_core_name(const char *core)
{
    if (!core) return NULL;
    for (size_t i = 0; i < NCORES; i++)
        if (!strcasecmp(cores[i].name, core)) return cores[i].name;
    return NULL;
}

int dl_blas_core_level(const char *core)
{
    if (!core) return -1;
    for (size_t i = 0; i < NCORES; i++)
        if (!strcasecmp(cores[i].name, core)) return cores[i].level;
    return -1;
}

/* whole-word search of one flag in a space-separated list */
static int has_flag(const char *flags, const char *flag, size_t len)
{
    for (const char *p = flags; *p;) {
        p += strspn(p, " \t\n");
        size_t n = strcspn(p, " \t\n");
        if (n && n == len && !strncmp(p, flag, len)) return 1;
        p += n;
    }
    return 0;
}

static int has_all(const char *flags, const char *need)
{
    for (const char *p = need; *p;) {
        while (*p == ' ') p++;
        size_t n = strcspn(p, " ");
        if (n && !has_flag(flags, p, n)) return 0;
        p += n;
    }
    return 1;
}

int dl_blas_flags_level(const char *flags)
{
    if (!flags) return DL_BLAS_LEVEL_NONE;
    for (int l = DL_BLAS_LEVEL_AVX512; l > DL_BLAS_LEVEL_SSE; l--)
        if (has_all(flags, level_flags[l])) return l;
    return has_flag(flags, "pni", 3) || has_flag(flags, "sse3", 4) ? DL_BLAS_LEVEL_SSE : DL_BLAS_LEVEL_NONE;
}

void dl_blas_flags_summary(const char *flags, char *out, size_t cap)
{
    int l = dl_blas_flags_level(flags);
    const char *s = l >= DL_BLAS_LEVEL_AVX512 ? "avx512f avx512bw avx512vl avx2 fma"
                    : l == DL_BLAS_LEVEL_AVX2 ? "avx2 fma"
                    : l == DL_BLAS_LEVEL_AVX  ? "avx"
                    : l == DL_BLAS_LEVEL_SSE  ? "sse3"
                                              : "unknown";
    snprintf(out, cap, "%s", s);
}

int dl_blas_choose(const char *flags, const char *vendor, const char *detected, char *core, size_t cap)
{
    int have = dl_blas_core_level(detected), can = dl_blas_flags_level(flags);
    if (have < 0 || have >= can) return 0; /* a core the table does not know is newer than it: trust it */
    const char *pick = NULL;
    int amd = vendor && (!strcmp(vendor, "AuthenticAMD") || !strcmp(vendor, "HygonGenuine"));
    if (can >= DL_BLAS_LEVEL_AVX512) pick = "SkylakeX";
    else if (can == DL_BLAS_LEVEL_AVX2) pick = amd ? "Zen" : "Haswell";
    else if (can == DL_BLAS_LEVEL_AVX) pick = "Sandybridge";
    if (!pick) return 0;
    snprintf(core, cap, "%s", pick);
    return 1;
}

/* ------------------------------------------------------------------------ */
/* the running process */

/* The first "flags" and "vendor_id" lines of /proc/cpuinfo; 0 when found. */
static int read_cpuinfo(char *flags, size_t fcap, char *vendor, size_t vcap)
{
    flags[0] = vendor[0] = 0;
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return -1;
    char *line = NULL;
    size_t n = 0;
    while (getline(&line, &n, f) > 0 && (!flags[0] || !vendor[0])) {
        char *colon = strchr(line, ':');
        if (!colon) continue;
        char *v = colon + 1 + strspn(colon + 1, " \t");
        v[strcspn(v, "\n")] = 0;
        if (!flags[0] && !strncmp(line, "flags", 5) && strchr(" \t", line[5])) snprintf(flags, fcap, "%s", v);
        else if (!vendor[0] && !strncmp(line, "vendor_id", 9)) snprintf(vendor, vcap, "%s", v);
    }
    free(line);
    fclose(f);
    return flags[0] ? 0 : -1;
}

static int traced(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return 0;
    char line[256];
    long pid = 0;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "TracerPid:", 10)) pid = strtol(line + 10, NULL, 10);
    fclose(f);
    return pid != 0;
}

/* The marker this module leaves in the environment when it set
 * OPENBLAS_CORETYPE itself: "CORE DETECTED BY PID". A child dloco program
 * inherits both and so knows the variable is dloco's choice, not the user's;
 * PID stops a second re-exec of the same process. */
#define MARK "DLOCO_BLAS_CHOICE"

typedef struct {
    char core[32], detected[32], by[16];
    long pid;
} mark;

static int read_mark(mark *m)
{
    const char *v = getenv(MARK);
    memset(m, 0, sizeof *m);
    return v && sscanf(v, "%31s %31s %15s %ld", m->core, m->detected, m->by, &m->pid) == 4 ? 0 : -1;
}

/* Finds --blas_core (or --blas-core, =value or next argument); its index
 * and how many argv slots it takes, 0 when absent; -1 when the value is missing. */
static int find_option(int argc, char **argv, int *at, const char **val)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strncmp(a, "--blas", 6) || (a[6] != '_' && a[6] != '-') || strncmp(a + 7, "core", 4)) continue;
        *at = i;
        if (a[11] == '=') {
            *val = a + 12;
            return 1;
        }
        if (a[11]) continue;
        if (i + 1 >= argc) return -1;
        *val = argv[i + 1];
        return 2;
    }
    return 0;
}

/* appends v to kv as a bare logfmt value: [A-Za-z0-9_.+-] kept, ' ' as ',', the rest as '_' */
static void bare(char *kv, size_t cap, const char *v)
{
    size_t l = strlen(kv);
    for (; *v && l + 1 < cap; v++)
        kv[l++] = (*v >= 'A' && *v <= 'Z') || (*v >= 'a' && *v <= 'z') || (*v >= '0' && *v <= '9') || strchr("_.+-", *v)
                      ? *v
                  : *v == ' ' ? ','
                              : '_';
    kv[l] = 0;
}

static void say(const char *core, const char *detected, const char *by, const char *cpu, const char *msg)
{
    char kv[1536] = "blas=openblas core=";
    bare(kv, sizeof kv, core);
    strcat(kv, " detected=");
    bare(kv, sizeof kv, detected[0] ? detected : "none");
    strcat(kv, " by=");
    bare(kv, sizeof kv, by);
    strcat(kv, " cpu=");
    bare(kv, sizeof kv, cpu);
    strcat(kv, " msg=\"");
    size_t l = strlen(kv);
    for (const unsigned char *c = (const unsigned char *)msg; *c && l + 6 < sizeof kv; c++) {
        if (*c == '"' || *c == '\\') kv[l++] = '\\', kv[l++] = (char)*c;
        else if (*c < 0x20 || *c == 0x7f) l += (size_t)snprintf(kv + l, 5, "\\x%02x", *c);
        else kv[l++] = (char)*c;
    }
    kv[l++] = '"';
    kv[l] = 0;
    dl_log_kv(DL_LOG_INFO, kv);
}

static void reexec(char **argv, const char *core, const char *detected, const char *by)
{
    char v[128], was[64], was_mark[128];
    const char *env = getenv("OPENBLAS_CORETYPE"), *old = getenv(MARK);
    snprintf(was, sizeof was, "%s", env ? env : "");
    snprintf(was_mark, sizeof was_mark, "%s", old ? old : "");
    snprintf(v, sizeof v, "%s %s %s %ld", core, detected, by, (long)getpid());
    if (setenv("OPENBLAS_CORETYPE", core, 1) || setenv(MARK, v, 1)) return;
    fflush(stdout);
    fflush(stderr);
    execv("/proc/self/exe", argv);
    /* still here: run on with the loaded core, the environment as it was (for children), and say why */
    if (env) setenv("OPENBLAS_CORETYPE", was, 1);
    else unsetenv("OPENBLAS_CORETYPE");
    if (old) setenv(MARK, was_mark, 1);
    else unsetenv(MARK);
}

/* Everything after the option: argv still holds it, so a re-exec repeats it. */
static int apply(char **argv, const char *want);

int dl_blas_select(int *argc, char **argv)
{
    int at = 0;
    const char *opt = NULL;
    int slots = find_option(*argc, argv, &at, &opt);
    if (slots < 0) {
        DL_ERROR("option --blas_core needs a value: auto or an OpenBLAS core name such as Haswell, Zen, SkylakeX");
        return DL_EINVAL;
    }
    const char *want = NULL; /* the core --blas_core names; NULL = auto */
    if (slots && strcasecmp(opt, "auto")) {
        if (!(want = dl_blas_core_name(opt))) {
            DL_ERROR("option --blas_core '%.64s' is not an OpenBLAS core this build knows: use auto, or Prescott, "
                     "Nehalem, Sandybridge, Haswell, Zen, SkylakeX, Cooperlake",
                     opt);
            return DL_EINVAL;
        }
    }
    int rc = apply(argv, want);
    /* argv without the option, for the program's own parser */
    if (slots) {
        memmove(argv + at, argv + at + slots, sizeof(char *) * (size_t)(*argc + 1 - at - slots));
        *argc -= slots;
    }
    return rc;
}

static int apply(char **argv, const char *want)
{
    if (!openblas_get_corename) {
        dl_log_kv(DL_LOG_INFO, "blas=other msg=\"not OpenBLAS: the linked BLAS chooses its own kernels\"");
        return 0;
    }
    char flags[4096], vendor[64], cpu[96], msg[512];
    int known = read_cpuinfo(flags, sizeof flags, vendor, sizeof vendor) == 0;
    dl_blas_flags_summary(flags, cpu, sizeof cpu);
    const char *loaded = openblas_get_corename();
    const char *env = getenv("OPENBLAS_CORETYPE");
    mark m;
    int ours = read_mark(&m) == 0 && env && !strcasecmp(env, m.core);
    int user = env && env[0] && !ours;
    int can = known ? dl_blas_flags_level(flags) : -1;

    if (want && known && dl_blas_core_level(want) > can) {
        DL_ERROR("option --blas_core %s needs %s, which this CPU does not report (it has: %s): it would stop with an "
                 "illegal instruction; use --blas_core auto",
                 want, level_flags[dl_blas_core_level(want)], cpu);
        return DL_EINVAL;
    }
    char pick[32] = "", why[16] = "";
    if (want && strcasecmp(loaded, want)) snprintf(pick, sizeof pick, "%s", want), snprintf(why, sizeof why, "option");
    else if (!want && !user && !ours && known && dl_blas_choose(flags, vendor, loaded, pick, sizeof pick))
        snprintf(why, sizeof why, "auto");
    if (pick[0]) {
        if (ours && m.pid == (long)getpid()) {
            snprintf(msg, sizeof msg, "openblas core %s: asked for %s but OpenBLAS did not take it", loaded, pick);
            say(loaded, m.detected, "detected", cpu, msg);
            return 0;
        }
        if (traced()) {
            snprintf(msg, sizeof msg,
                     "openblas core %s, not %s: not re-executed under a debugger (set OPENBLAS_CORETYPE=%s before "
                     "starting it; cpu flags %s)",
                     loaded, pick, pick, cpu);
            say(loaded, loaded, "detected", cpu, msg);
            return 0;
        }
        /* the core OpenBLAS loaded without dloco's choice travels in the marker */
        reexec(argv, pick, ours ? m.detected : loaded, why);
        snprintf(msg, sizeof msg, "openblas core %s, not %s: re-executing this program failed (set OPENBLAS_CORETYPE=%s)",
                 loaded, pick, pick);
        say(loaded, loaded, "detected", cpu, msg);
        return 0;
    }
    if (known && dl_blas_core_level(loaded) > can) {
        DL_ERROR("OpenBLAS runs core %s (OPENBLAS_CORETYPE=%s), which needs %s; this CPU does not report it (it has: "
                 "%s): it would stop with an illegal instruction; unset OPENBLAS_CORETYPE or set a lower core",
                 loaded, env ? env : "", level_flags[dl_blas_core_level(loaded)], cpu);
        return DL_EINVAL;
    }
    const char *detected = ours ? m.detected : loaded;
    const char *by = ours ? m.by : want ? "option" : user ? "env" : "detected";
    if (ours && strcasecmp(loaded, m.core))
        snprintf(msg, sizeof msg, "openblas core %s (asked for %s by %s, OpenBLAS did not take it; detected %s)", loaded,
                 m.core, m.by, m.detected);
    else if (ours)
        snprintf(msg, sizeof msg, "openblas core %s (%s: detected %s; cpu flags %s)", loaded,
                 strcmp(m.by, "option") ? "chosen from the cpu flags" : "forced by --blas_core", m.detected, cpu);
    else if (want)
        snprintf(msg, sizeof msg, "openblas core %s (as --blas_core asks; cpu flags %s)", loaded, cpu);
    else if (user)
        snprintf(msg, sizeof msg, "openblas core %s (OPENBLAS_CORETYPE=%.40s set by the user; cpu flags %s)", loaded, env,
                 cpu);
    else if (known)
        snprintf(msg, sizeof msg, "openblas core %s (detected by OpenBLAS, the best these flags allow; cpu flags %s)",
                 loaded, cpu);
    else
        snprintf(msg, sizeof msg, "openblas core %s (detected by OpenBLAS; no x86 cpu flags to compare)", loaded);
    say(loaded, detected, by, cpu, msg);
    return 0;
}
