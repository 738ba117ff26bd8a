/* libFuzzer target: the config parser (core/config.c), the input as an INI file
 * for dl_cfg_load_ini and, split on NUL bytes, as argv for dl_cfg_parse_args. */
#define _GNU_SOURCE /* memfd_create */
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/config.h"
#include "core/err.h"
#include "core/model.h"
#include "tests/fuzz/fuzz.h"

/* Rows copied from synchronizer/main.c and gpt/options.c: every DL_CFG_*
 * type, reloadable and not, the 9.2e18 seed bound, open and closed float
 * bounds, enums of 2-4 choices with '-' in a name, empty defaults, the
 * model rows every program embeds, and one dotted name ("[chaos] seed" in
 * an INI file; no program has sections yet, the parser does). */
typedef struct {
    char bind[DL_CFG_STRLEN], run_id[DL_CFG_STRLEN], events[DL_CFG_STRLEN];
    dl_model_opts model;
    int64_t H, seed, quorum, heartbeat_ms, threads, chaos_seed;
    char policy[DL_CFG_STRLEN], staleness[DL_CFG_STRLEN], log_level[DL_CFG_STRLEN], adopt[DL_CFG_STRLEN];
    double gamma, outer_momentum, eps, throttle, val_frac;
    int share_scaling, standalone;
} fuzz_cfg;

#define F(x) offsetof(fuzz_cfg, x)
static const dl_cfg_entry table[] = {
    {"bind", DL_CFG_STR, F(bind), 0, 0, "tcp://127.0.0.1:5555", NULL, 0, "ZeroMQ endpoint to bind"},
    {"run_id", DL_CFG_STR, F(run_id), 0, 0, "dloco", NULL, 0, "run id"},
    {"events", DL_CFG_STR, F(events), 0, 0, "", NULL, 0, "event log"},
    DL_MODEL_CFG_ROWS(fuzz_cfg, model, "0", "vocabulary (0 = from the data)"),
    {"H", DL_CFG_INT, F(H), 1, 1000000, "24", NULL, 0, "inner steps"},
    {"seed", DL_CFG_INT, F(seed), 0, 9.2e18, "1337", NULL, 0, "seed"},
    {"quorum", DL_CFG_INT, F(quorum), 1, 65536, "1", NULL, 1, "K"},
    {"heartbeat_ms", DL_CFG_INT, F(heartbeat_ms), 10, 600000, "500", NULL, 0, "heartbeat period, ms"},
    {"threads", DL_CFG_INT, F(threads), 0, 1024, "0", NULL, 0, "CPU threads"},
    {"chaos.seed", DL_CFG_INT, F(chaos_seed), -1000000, 1000000, "-1", NULL, 1, "dotted name, negative bound"},
    {"policy", DL_CFG_ENUM, F(policy), 0, 0, "decoupled", "decoupled|sync|sync-elastic", 0, "merge policy"},
    {"staleness", DL_CFG_ENUM, F(staleness), 0, 0, "poly", "const|poly|hinge", 1, "staleness factor"},
    {"log_level", DL_CFG_ENUM, F(log_level), 0, 0, "info", "debug|info|warn|error", 0, "log verbosity"},
    {"adopt", DL_CFG_ENUM, F(adopt), 0, 0, "overwrite", "overwrite|mix|keep", 0, "adopt rule"},
    {"gamma", DL_CFG_FLOAT, F(gamma), 1e-6, 10, "0.5", NULL, 1, "grace fraction"},
    {"outer_momentum", DL_CFG_FLOAT, F(outer_momentum), 0, 0.999, "0.9", NULL, 1, "outer momentum"},
    {"eps", DL_CFG_FLOAT, F(eps), 1e-12, 1e-2, "1e-8", NULL, 0, "AdamW epsilon"},
    {"throttle", DL_CFG_FLOAT, F(throttle), 0.001, 1.0, "1", NULL, 0, "duty cycle"},
    {"val_frac", DL_CFG_FLOAT, F(val_frac), 0.0, 0.5, "0.05", NULL, 0, "held-out fraction"},
    {"share_scaling", DL_CFG_BOOL, F(share_scaling), 0, 0, "true", NULL, 1, "scale by share"},
    {"standalone", DL_CFG_BOOL, F(standalone), 0, 0, "false", NULL, 0, "train alone"},
};
#undef F
#define NCFG (sizeof table / sizeof table[0])

/* The input as a file: a memfd opened again through /proc/self/fd/N. */
typedef struct {
    int fd;
    char path[64];
} memfile;

#define MAX_CONFIGS 4          /* --config files of one argv */
static memfile g_ini;          /* the whole input, for dl_cfg_load_ini */
static memfile g_cfg[MAX_CONFIGS];
static FILE *g_null;           /* dl_cfg_print / dl_cfg_usage write here */
static int g_ready;

static void memfile_open(memfile *m)
{
    m->fd = memfd_create("fuzz_config.ini", 0);
    FUZZ_CHECK(m->fd >= 0, "memfd_create: %s", strerror(errno));
    snprintf(m->path, sizeof m->path, "/proc/self/fd/%d", m->fd);
}

static void memfile_write(memfile *m, const void *data, size_t size)
{
    FUZZ_CHECK(ftruncate(m->fd, 0) == 0, "ftruncate: %s", strerror(errno));
    size_t off = 0;
    while (off < size) {
        ssize_t w = pwrite(m->fd, (const char *)data + off, size - off, (off_t)off);
        FUZZ_CHECK(w > 0, "pwrite: %s", strerror(errno));
        off += (size_t)w;
    }
}

static void setup(void)
{
    memfile_open(&g_ini);
    for (int i = 0; i < MAX_CONFIGS; i++) memfile_open(&g_cfg[i]);
    g_null = fopen("/dev/null", "w");
    FUZZ_CHECK(g_null, "/dev/null: %s", strerror(errno));
    dl_cfg_usage(table, NCFG, g_null);
    g_ready = 1;
}

static int choice_in(const char *choices, const char *v)
{
    size_t vl = strlen(v);
    for (const char *p = choices;;) {
        const char *bar = strchr(p, '|');
        size_t l = bar ? (size_t)(bar - p) : strlen(p);
        if (l == vl && memcmp(p, v, l) == 0) return 1;
        if (!bar) return 0;
        p = bar + 1;
    }
}

/* Whatever the parser accepted obeys the table, and formats to text that the
 * parser accepts again (dl_cfg_print's output is what a run records). */
static void check_obj(const fuzz_cfg *c)
{
    for (size_t i = 0; i < NCFG; i++) {
        const dl_cfg_entry *e = &table[i];
        const char *field = (const char *)c + e->offset;
        switch (e->type) {
        case DL_CFG_INT: {
            int64_t v = *(const int64_t *)field;
            FUZZ_CHECK((double)v >= e->min && (double)v <= e->max, "%s = %lld", e->name, (long long)v);
            break;
        }
        case DL_CFG_FLOAT: {
            double v = *(const double *)field;
            FUZZ_CHECK(isfinite(v) && v >= e->min && v <= e->max, "%s = %g", e->name, v);
            break;
        }
        case DL_CFG_STR:
            FUZZ_CHECK(memchr(field, 0, DL_CFG_STRLEN) != NULL, "%s is not terminated", e->name);
            break;
        case DL_CFG_ENUM: FUZZ_CHECK(choice_in(e->choices, field), "%s = '%s'", e->name, field); break;
        case DL_CFG_BOOL: {
            int v = *(const int *)field;
            FUZZ_CHECK(v == 0 || v == 1, "%s = %d", e->name, v);
            break;
        }
        }
        char buf[DL_CFG_STRLEN + 32];
        dl_cfg_format(e, c, buf, sizeof buf);
        fuzz_cfg copy = *c;
        int rc = dl_cfg_set(table, NCFG, &copy, e->name, buf);
        FUZZ_CHECK(rc == 0, "%s: formatted value '%s' is refused: %s", e->name, buf, dl_errmsg());
    }
    dl_cfg_print(table, NCFG, c, g_null);
}

#define MAX_ARGS 1024

/* argv[1..] from the input split on NUL (a final NUL ends the last argument).
 * The value of each --config becomes the text of a file, and argv names that
 * file instead: the fuzzer writes the config inline, and the parser never
 * opens a path the fuzzer made up. */
static int run_args(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    char **argv = malloc((MAX_ARGS + 2) * sizeof *argv);
    char cfg_eq[MAX_CONFIGS][80];
    FUZZ_CHECK(text && argv, "malloc");
    memcpy(text, data, size);
    text[size] = 0;
    int argc = 0, ncfg = 0;
    argv[argc++] = "fuzz_config";
    for (size_t i = 0; i < size && argc <= MAX_ARGS;) {
        char *a = text + i;
        size_t l = strlen(a);
        i += l + 1;
        int k = ncfg < MAX_CONFIGS ? ncfg : MAX_CONFIGS - 1;
        if (!strncmp(a, "--config=", 9)) {
            memfile_write(&g_cfg[k], a + 9, l - 9);
            snprintf(cfg_eq[k], sizeof cfg_eq[k], "--config=%s", g_cfg[k].path);
            argv[argc++] = cfg_eq[k];
            ncfg++;
        } else if (!strcmp(argv[argc - 1], "--config")) {
            memfile_write(&g_cfg[k], a, l);
            argv[argc++] = g_cfg[k].path;
            ncfg++;
        } else {
            argv[argc++] = a;
        }
    }
    argv[argc] = NULL;

    fuzz_cfg c;
    memset(&c, 0xA5, sizeof c); /* parse_args must set every field itself */
    dl_err_clear();
    int rc = dl_cfg_parse_args(table, NCFG, &c, argc, argv);
    if (rc == 0) check_obj(&c);
    else if (rc != 1) FUZZ_CHECK(rc < 0 && dl_errmsg()[0], "parse_args rc %d without a message", rc);
    free(argv);
    free(text);
    return rc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!g_ready) setup();
    memfile_write(&g_ini, data, size);

    fuzz_cfg c;
    int rc = dl_cfg_defaults(table, NCFG, &c);
    FUZZ_CHECK(rc == 0, "defaults: %s", dl_errmsg());
    dl_err_clear();
    rc = dl_cfg_load_ini(table, NCFG, &c, g_ini.path);
    /* a refused line stops the load; the lines before it are applied, and
     * each of them was validated, so the object is sound either way */
    FUZZ_CHECK(rc == 0 || (rc < 0 && dl_errmsg()[0]), "load_ini rc %d without a message", rc);
    check_obj(&c);
    char why[600];
    snprintf(why, sizeof why, "%s", rc ? dl_errmsg() : "");

    int arc = run_args(data, size);
    if (rc == 0) FUZZ_VERDICT("accepted as an INI file");
    else if (arc >= 0) FUZZ_VERDICT("accepted as arguments%s", arc == 1 ? " (--help)" : "");
    else FUZZ_VERDICT("refused: as INI: %s; as arguments: %s", why, dl_errmsg());
    return 0;
}
