/* Tests of the config table (core/config.c): --help's layout and bounds,
 * units, dash/underscore names, --print-config's INI round trip (quoting,
 * sections), refusals that name the option, the shared INI line reader, the
 * programs' option preamble (dl_cfg_main_parse). */
#include "core/config.h"

#include "core/err.h"
#include "tests/check.h"

#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
    int64_t vocab, grace_cap_ms, big, chunk_kb, steps;
    double gamma, rate_per_s;
    char path[DL_CFG_STRLEN], note[DL_CFG_STRLEN], level[DL_CFG_STRLEN];
    int flag;
    int64_t net_port;
    char net_host[DL_CFG_STRLEN];
} cfg;

#define F(x) offsetof(cfg, x)
static const dl_cfg_entry table[] = {
    {"vocab", DL_CFG_INT, F(vocab), 2, 16777216, "256", NULL, 0, "vocabulary"},
    {"grace_cap_ms", DL_CFG_INT, F(grace_cap_ms), 1, 86400000, "5000", NULL, 1, "grace window cap"},
    {"big", DL_CFG_INT, F(big), 0, 9.2e18, "1", NULL, 0, "a seed"},
    {"chunk_kb", DL_CFG_INT, F(chunk_kb), 4, 65536, "1024", NULL, 0, "chunk"},
    {"steps", DL_CFG_INT, F(steps), 1, 1000, "10", NULL, 0, "inner steps", "steps"},
    {"gamma", DL_CFG_FLOAT, F(gamma), 1e-6, 10, "0.5", NULL, 1, "fraction"},
    {"rate_per_s", DL_CFG_FLOAT, F(rate_per_s), 0, 1e9, "20", NULL, 0, "rate"},
    {"path", DL_CFG_STR, F(path), 0, 0, "runs/x.lmdb", NULL, 0, "a path"},
    {"note", DL_CFG_STR, F(note), 0, 0, "", NULL, 0, "free text"},
    {"log_level", DL_CFG_ENUM, F(level), 0, 0, "info", "debug|info|warn|error", 0, "verbosity"},
    {"flag", DL_CFG_BOOL, F(flag), 0, 0, "false", NULL, 1, "a switch"},
    {"net.port", DL_CFG_INT, F(net_port), 1, 65535, "5555", NULL, 0, "port"},
    {"net.host", DL_CFG_STR, F(net_host), 0, 0, "127.0.0.1", NULL, 0, "host"},
};
#undef F
#define N (sizeof table / sizeof table[0])

static char dir[] = "/tmp/test_config.XXXXXX";

static char *print_of(const cfg *c)
{
    char *text = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&text, &len);
    dl_cfg_print(table, N, c, m);
    fclose(m);
    return text;
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    REQUIRE(f, "%s", path);
    fputs(text, f);
    fclose(f);
}

static int parse(cfg *c, int argc, const char **argv) { return dl_cfg_parse_args(table, N, c, argc, (char **)argv); }

static void test_usage(void)
{
    char *text = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&text, &len);
    dl_cfg_usage(table, N, m);
    fclose(m);
    CHECK(strstr(text, "range 2 .. 16777216") != NULL, "integer bounds in full:\n%s", text);
    CHECK(strstr(text, "range 0 .. 9200000000000000000") != NULL, "a large integer bound in full");
    CHECK(strstr(text, "e+") == NULL, "no exponent in integer bounds");
    CHECK(strstr(text, "range 1e-6 .. 10") != NULL, "float bounds short");
    CHECK(strstr(text, "range 0 .. 1e9") != NULL, "float bounds short");
    CHECK(strstr(text, "--grace_cap_ms <int, ms>") != NULL, "unit from _ms");
    CHECK(strstr(text, "--chunk_kb <int, KiB>") != NULL, "unit from _kb");
    CHECK(strstr(text, "--rate_per_s <float, 1/s>") != NULL, "unit from _per_s");
    CHECK(strstr(text, "--steps <int, steps>") != NULL, "explicit unit");
    CHECK(strstr(text, "one of debug|info|warn|error") != NULL, "choices");
    /* every option with its default and whether it reloads */
    for (size_t i = 0; i < N; i++) {
        char want[128];
        snprintf(want, sizeof want, "--%s <", table[i].name);
        const char *at = strstr(text, want);
        CHECK(at != NULL, "usage lists %s", table[i].name);
        if (!at) continue;
        const char *nl = strchr(at, '\n');
        const char *nl2 = nl ? strchr(nl + 1, '\n') : NULL;
        CHECK(nl && nl2 && strstr(nl, "default ") && strstr(nl, "default ") < nl2, "%s: default on its line",
              table[i].name);
        const char *r = strstr(nl, table[i].reloadable ? "reloadable (SIGHUP)" : "restart to change");
        CHECK(r && r < nl2, "%s: reloadable %d shown", table[i].name, table[i].reloadable);
    }
    free(text);
}

/* --help in sections: the first in full, the rest one line each, options
 * no section names last; --help-all every option in full; a section naming
 * a missing option or one option twice is caught. */
static void test_sections(void)
{
    static const dl_cfg_section sec[] = {{"common", "steps path"}, {"tuning", "gamma grace_cap_ms"}};
    CHECK_EQ(dl_cfg_sections_check(table, N, sec, 2), 0);
    cfg c;
    const char *help[] = {"p", "--help"}, *all[] = {"p", "--help-all"};
    CHECK_EQ(parse(&c, 2, help), DL_CFG_HELP);
    CHECK_EQ(dl_cfg_help_all(), 0);
    char *text = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&text, &len);
    dl_cfg_usage_sections(table, N, sec, 2, m);
    fclose(m);
    const char *common = strstr(text, "\ncommon:\n"), *tuning = strstr(text, "\ntuning:\n"),
               *other = strstr(text, "\nother options:\n");
    CHECK(common && tuning && other && common < tuning && tuning < other, "headings in order:\n%s", text);
    const char *steps = strstr(text, "  --steps <int, steps>\n      default 10");
    CHECK(steps && steps > common && steps < tuning, "a common option in full under its heading");
    const char *gamma = strstr(text, "  --gamma <float> = 0.5");
    CHECK(gamma && gamma > tuning && gamma < other, "another section's option on one line");
    CHECK(strstr(text, "  --gamma <float>\n") == NULL, "not in full under --help");
    const char *g = strstr(text, "--grace_cap_ms"), *gm = strstr(text, "--gamma");
    CHECK(g && gm && gm < g, "a section's options in its own order");
    for (size_t i = 0; i < N; i++) {
        char want[128];
        snprintf(want, sizeof want, "  --%s <", table[i].name);
        CHECK(strstr(text, want) != NULL, "--help lists %s", table[i].name);
    }
    const char *note = strstr(text, "--note <text> = \"\"");
    CHECK(note && note > other, "an option no section names comes under other options");
    free(text);

    CHECK_EQ(parse(&c, 2, all), DL_CFG_HELP);
    CHECK_EQ(dl_cfg_help_all(), 1);
    m = open_memstream(&text, &len);
    dl_cfg_usage_sections(table, N, sec, 2, m);
    fclose(m);
    CHECK(strstr(text, "  --gamma <float>\n      default 0.5") != NULL, "--help-all: every option in full:\n%s", text);
    CHECK(strstr(text, "  --note <text>\n      default") != NULL, "--help-all: other options in full");
    free(text);
    CHECK_EQ(parse(&c, 2, help), DL_CFG_HELP);
    CHECK_EQ(dl_cfg_help_all(), 0);

    static const dl_cfg_section typo[] = {{"common", "steps pathh"}};
    CHECK(dl_cfg_sections_check(table, N, typo, 1) == DL_EINVAL && strstr(dl_errmsg(), "'pathh'"),
          "a name that is no option: %s", dl_errmsg());
    static const dl_cfg_section twice[] = {{"a", "steps"}, {"b", "gamma steps"}};
    CHECK(dl_cfg_sections_check(table, N, twice, 2) == DL_EINVAL && strstr(dl_errmsg(), "two --help sections"),
          "an option in two sections: %s", dl_errmsg());
    static const dl_cfg_section dup[] = {{"a", "steps gamma steps"}};
    CHECK(dl_cfg_sections_check(table, N, dup, 1) == DL_EINVAL && strstr(dl_errmsg(), "twice"),
          "an option twice in one section: %s", dl_errmsg());
}

static void test_names(void)
{
    cfg c;
    const char *a1[] = {"p", "--log-level", "debug", "--grace-cap-ms=7", "--log_level=warn"};
    CHECK_EQ(parse(&c, 5, a1), 0);
    CHECK(!strcmp(c.level, "warn") && c.grace_cap_ms == 7, "dash and underscore are one: %s %lld", c.level,
          (long long)c.grace_cap_ms);
    const char *a2[] = {"p", "--print-config", "--flag"};
    CHECK_EQ(parse(&c, 3, a2), DL_CFG_PRINT);
    CHECK_EQ(c.flag, 1);
    const char *a3[] = {"p", "--print_config"};
    CHECK_EQ(parse(&c, 2, a3), DL_CFG_PRINT);
    const char *a4[] = {"p", "--print-config", "--vocab", "1"};
    CHECK(parse(&c, 4, a4) == DL_ERANGE, "an invalid config is refused even with --print-config");
    const char *a5[] = {"p", "--help"};
    CHECK_EQ(parse(&c, 2, a5), DL_CFG_HELP);
}

static void options_short(FILE *f) { fputs("options: see the manual\n", f); }

/* A program's cross-option check: here, vocab must be even. */
static int vocab_even(void *obj)
{
    return ((const cfg *)obj)->vocab % 2 ? dl_err(DL_EINVAL, "option vocab: must be even") : 0;
}

/* dl_cfg_main_parse, as every program's main uses it: --help and
 * --print-config end with exit 0 (the check refuses before printing), a bad
 * option or refused check with exit 2 and one line naming the program; a
 * start goes on (the check is main's to run then). Output captured in a file. */
static void test_main_parse(void)
{
    static const dl_cfg_main m = {"prog", "usage: prog [--name value ...]\n", vocab_even};
    char path[300];
    snprintf(path, sizeof path, "%s/main.out", dir);
    fflush(stdout);
    fflush(stderr);
    int so = dup(1), se = dup(2), fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    REQUIRE(so >= 0 && se >= 0 && fd >= 0, "redirect");
    dup2(fd, 1);
    dup2(fd, 2);
    close(fd);
    cfg c;
    int done[5], code[5];
    const char *help[] = {"p", "--help"}, *print[] = {"p", "--print-config", "--vocab", "4"},
               *odd[] = {"p", "--print-config", "--vocab", "5"}, *bad[] = {"p", "--vocab", "x"},
               *start[] = {"p", "--vocab", "5"};
    done[0] = dl_cfg_main_parse(table, N, &c, &m, 2, (char **)help, &code[0]);
    done[1] = dl_cfg_main_parse(table, N, &c, &m, 4, (char **)print, &code[1]);
    done[2] = dl_cfg_main_parse(table, N, &c, &m, 4, (char **)odd, &code[2]);
    done[3] = dl_cfg_main_parse(table, N, &c, &m, 3, (char **)bad, &code[3]);
    done[4] = dl_cfg_main_parse(table, N, &c, &m, 3, (char **)start, &code[4]);
    fflush(stdout);
    fflush(stderr);
    dup2(so, 1);
    dup2(se, 2);
    close(so);
    close(se);
    CHECK(done[0] == 1 && code[0] == 0, "--help: done %d exit %d", done[0], code[0]);
    CHECK(done[1] == 1 && code[1] == 0, "--print-config: done %d exit %d", done[1], code[1]);
    CHECK(done[2] == 1 && code[2] == 2, "--print-config of a config the check refuses: done %d exit %d", done[2],
          code[2]);
    CHECK(done[3] == 1 && code[3] == 2, "a bad value: done %d exit %d", done[3], code[3]);
    CHECK(done[4] == 0 && c.vocab == 5, "a start goes on with the parsed config: done %d vocab %lld", done[4],
          (long long)c.vocab);
    FILE *f = fopen(path, "r");
    char text[16384] = "";
    size_t n = f ? fread(text, 1, sizeof text - 1, f) : 0;
    text[n] = 0;
    if (f) fclose(f);
    CHECK(strstr(text, "usage: prog [--name value ...]\noptions: ") && strstr(text, "  --vocab <int>"),
          "--help: the usage line, then the options: %.300s", text);
    CHECK(strstr(text, "\nvocab = 4\n") != NULL, "--print-config printed the config");
    CHECK(strstr(text, "prog: bad configuration: ") && strstr(text, "option vocab: must be even"),
          "the refused check named: %s", text);
    CHECK(strstr(text, "option vocab: 'x' is not an integer") != NULL, "the bad value named");
    CHECK(!strstr(text, "vocab = 5"), "nothing printed for the refused --print-config");
    /* a program that lists its options itself (in sections) */
    static const dl_cfg_main own = {"prog", NULL, NULL, options_short};
    fflush(stdout);
    so = dup(1);
    fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    REQUIRE(so >= 0 && fd >= 0, "redirect");
    dup2(fd, 1);
    close(fd);
    int d = dl_cfg_main_parse(table, N, &c, &own, 2, (char **)help, &code[0]);
    fflush(stdout);
    dup2(so, 1);
    close(so);
    f = fopen(path, "r");
    n = f ? fread(text, 1, sizeof text - 1, f) : 0;
    text[n] = 0;
    if (f) fclose(f);
    CHECK(d == 1 && code[0] == 0 && !strcmp(text, "options: see the manual\n"),
          "--help with the program's own list: %s", text);
}

/* A refusal names the option (and the bounds); file errors name path:line. */
static void refused(const char *flag, const char *value, int want_rc, const char *want_msg)
{
    cfg c;
    const char *argv[] = {"p", flag, value};
    int rc = parse(&c, 3, argv);
    CHECK(rc == want_rc && strstr(dl_errmsg(), want_msg), "%s %s: rc %d, '%s' (want %d, '%s')", flag, value, rc,
          dl_errmsg(), want_rc, want_msg);
}

static void test_refusals(void)
{
    refused("--vocab", "1", DL_ERANGE, "option vocab: 1 out of range [2, 16777216]");
    refused("--vocab", "12x", DL_EINVAL, "option vocab: '12x' is not an integer");
    refused("--gamma", "nan", DL_EINVAL, "option gamma: 'nan' is not a finite number");
    refused("--gamma", "11", DL_ERANGE, "option gamma: 11 out of range [1e-6, 10]");
    refused("--log-level", "loud", DL_EINVAL, "option log_level: 'loud' is not one of debug|info|warn|error");
    refused("--flag", "maybe", DL_EINVAL, "unexpected argument 'maybe'");
    refused("--flag=maybe", "--flag", DL_EINVAL, "option flag: 'maybe' is not a boolean");
    refused("--nosuch", "1", DL_EINVAL, "unknown option '--nosuch'");
    char path[300], arg[320];
    snprintf(path, sizeof path, "%s/bad.ini", dir);
    write_file(path, "vocab = 300\n\n[net]\nport = 70000\n");
    snprintf(arg, sizeof arg, "--config=%s", path);
    cfg c;
    const char *argv[] = {"p", arg};
    int rc = parse(&c, 2, argv);
    char want[400];
    snprintf(want, sizeof want, "%s:4: option net.port: 70000 out of range [1, 65535]", path);
    CHECK(rc == DL_ERANGE && strstr(dl_errmsg(), want), "file error names path:line and option: %s", dl_errmsg());
    write_file(path, "note = \"unclosed\n");
    CHECK(parse(&c, 2, argv) == DL_EINVAL && strstr(dl_errmsg(), ":1: note: unbalanced quotes"), "%s", dl_errmsg());
}

/* print -> load -> print is the same text, whatever the strings hold. */
static void test_round_trip(void)
{
    static const char *notes[] = {"",           "plain",        " leading space", "trailing space ",
                                  "has # hash", "semi; colon",  "a \"quote\"",    "back\\slash",
                                  "\"",         "tab\there",    "new\nline",      "= equals = sign"};
    char path[300], arg[320];
    snprintf(path, sizeof path, "%s/rt.ini", dir);
    snprintf(arg, sizeof arg, "--config=%s", path);
    for (size_t k = 0; k < sizeof notes / sizeof notes[0]; k++) {
        cfg a, b;
        const char *argv[] = {"p", "--note", notes[k], "--net.host", "h o#st", "--gamma", "0.1", "--flag"};
        REQUIRE(parse(&a, 8, argv) == 0, "%s", dl_errmsg());
        char *t1 = print_of(&a);
        write_file(path, t1);
        const char *argv2[] = {"p", arg};
        int rc = parse(&b, 2, argv2);
        CHECK(rc == 0, "printed config loads: %s\n%s", dl_errmsg(), t1);
        char *t2 = print_of(&b);
        CHECK(!strcmp(t1, t2), "round trip of note '%s':\n%s---\n%s", notes[k], t1, t2);
        CHECK(!strcmp(b.note, notes[k]), "note read back: '%s' vs '%s'", b.note, notes[k]);
        free(t1);
        free(t2);
    }
    cfg a;
    const char *argv[] = {"p"};
    REQUIRE(parse(&a, 1, argv) == 0, "%s", dl_errmsg());
    char *t = print_of(&a);
    CHECK(strstr(t, "vocab = 256\n") == t, "flat keys first:\n%s", t);
    CHECK(strstr(t, "\n[net]\nport = 5555\nhost = 127.0.0.1\n") != NULL, "a section for dotted names:\n%s", t);
    CHECK(strstr(t, "note = \"\"\n") != NULL, "empty string quoted");
    CHECK(strstr(t, "gamma = 0.5\n") != NULL, "float");
    free(t);
    /* floats print exactly and short */
    const char *fa[] = {"p", "--gamma", "0.1234567891234567", "--rate_per_s", "0.7"};
    REQUIRE(parse(&a, 5, fa) == 0, "%s", dl_errmsg());
    t = print_of(&a);
    CHECK(strstr(t, "gamma = 0.1234567891234567\n") != NULL && strstr(t, "rate_per_s = 0.7\n") != NULL,
          "floats exact and short:\n%s", t);
    free(t);
}

static void test_ini_reader(void)
{
    char path[300];
    snprintf(path, sizeof path, "%s/r.ini", dir);
    write_file(path, "# comment\n  ; another\n[ s x ] # c\nk = v ; c\nq = \"a # b ; c\" # c\n\n");
    dl_ini r;
    REQUIRE(dl_ini_open(&r, path) == 0, "%s", dl_errmsg());
    char *a = NULL, *b = NULL;
    CHECK(dl_ini_next(&r, &a, &b) == DL_INI_SECTION && !strcmp(a, "s x") && r.line == 3, "section '%s'", a);
    CHECK(dl_ini_next(&r, &a, &b) == DL_INI_KEY && !strcmp(a, "k") && !strcmp(b, "v"), "k = '%s'", b);
    CHECK(dl_ini_next(&r, &a, &b) == DL_INI_KEY && !strcmp(a, "q") && !strcmp(b, "a # b ; c"), "q = '%s'", b);
    CHECK(dl_ini_next(&r, &a, &b) == DL_INI_END, "end");
    dl_ini_close(&r);
    dl_ini_close(&r); /* safe twice */
    CHECK(dl_ini_open(&r, "/nonexistent/x.ini") == DL_EIO && strstr(dl_errmsg(), "/nonexistent/x.ini"), "%s",
          dl_errmsg());
}

/* The reload plan: reloadable values come from the fresh parse, restart-only
 * ones stay at the running values (reported as ignored), and a later reload
 * compares against what runs, never against an ignored value. */
static void test_reload_plan(void)
{
    cfg run, fresh, cand;
    unsigned char what[N];
    char diff[256];
    const char *start[] = {"p", "--vocab", "300"};
    REQUIRE(parse(&run, 3, start) == 0, "%s", dl_errmsg());
    /* file 1: grace_cap_ms (reloadable) and chunk_kb (restart-only) change */
    const char *f1[] = {"p", "--vocab", "300", "--grace_cap_ms", "4000", "--chunk_kb", "64"};
    REQUIRE(parse(&fresh, 7, f1) == 0, "%s", dl_errmsg());
    cand = run;
    CHECK_EQ(dl_cfg_reload_plan(table, N, &run, &fresh, &cand, what), 1);
    CHECK_EQ(cand.grace_cap_ms, 4000);
    CHECK(cand.chunk_kb == 1024, "restart-only value kept at the running one: %lld", (long long)cand.chunk_kb);
    CHECK_EQ(dl_cfg_diff(table, N, what, DL_CFG_APPLY, &run, &cand, diff, sizeof diff), 1);
    CHECK(!strcmp(diff, "grace_cap_ms 5000 -> 4000"), "applied diff '%s'", diff);
    CHECK_EQ(dl_cfg_diff(table, N, what, DL_CFG_IGNORE, &run, &fresh, diff, sizeof diff), 1);
    CHECK(!strcmp(diff, "chunk_kb 1024 -> 64"), "ignored diff '%s'", diff);
    run = cand; /* applied */
    /* file 2: chunk_kb gone again, gamma changes: nothing phantom about chunk_kb */
    const char *f2[] = {"p", "--vocab", "300", "--grace_cap_ms", "4000", "--gamma", "0.25"};
    REQUIRE(parse(&fresh, 7, f2) == 0, "%s", dl_errmsg());
    cand = run;
    CHECK_EQ(dl_cfg_reload_plan(table, N, &run, &fresh, &cand, what), 1);
    CHECK_EQ(dl_cfg_diff(table, N, what, DL_CFG_IGNORE, &run, &fresh, diff, sizeof diff), 0);
    CHECK_EQ(dl_cfg_diff(table, N, what, DL_CFG_APPLY, &run, &cand, diff, sizeof diff), 1);
    CHECK(!strcmp(diff, "gamma 0.5 -> 0.25"), "only the real change: '%s'", diff);
    /* nothing changes: nothing applied, nothing ignored */
    run = cand;
    CHECK_EQ(dl_cfg_reload_plan(table, N, &run, &fresh, &cand, what), 0);
    for (size_t i = 0; i < N; i++) CHECK(what[i] == DL_CFG_KEEP, "%s kept", table[i].name);
    /* strings and booleans are copied whole */
    const char *f3[] = {"p", "--vocab", "300", "--flag", "--note", "x y"};
    REQUIRE(parse(&fresh, 6, f3) == 0, "%s", dl_errmsg());
    cand = run;
    CHECK_EQ(dl_cfg_reload_plan(table, N, &run, &fresh, &cand, what), 3);
    CHECK(cand.flag == 1 && !strcmp(cand.note, ""), "flag applied (%d), note restart-only kept ('%s')", cand.flag,
          cand.note);
}

int main(void)
{
    REQUIRE(mkdtemp(dir), "mkdtemp");
    test_usage();
    test_sections();
    test_names();
    test_refusals();
    test_round_trip();
    test_ini_reader();
    test_reload_plan();
    test_main_parse();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) printf("note: could not remove %s\n", dir);
    printf("test_config: %d checks, %d failures\n", checks, failures);
    return failures ? 1 : 0;
}
