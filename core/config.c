/* Config table parsing: defaults -> INI -> flags, each value checked against
 * its entry's type and bounds so a bad value is refused with its name. */
#include "core/config.h"
#include "core/err.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <string.h>
#include <strings.h>

/* '-' and '_' are one character in names: --log-level is --log_level. */
static int name_eq(const char *a, const char *b)
{
    for (;; a++, b++) {
        char x = *a == '-' ? '_' : *a, y = *b == '-' ? '_' : *b;
        if (x != y) return 0;
        if (!x) return 1;
    }
}

const dl_cfg_entry *dl_cfg_find(const dl_cfg_entry *t, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (name_eq(t[i].name, name)) return &t[i];
    return NULL;
}

const char *dl_cfg_unit(const dl_cfg_entry *e)
{
    static const char *suffix[][2] = {{"_per_s", "1/s"}, {"_ms", "ms"}, {"_us", "us"}, {"_ns", "ns"},
                                      {"_s", "s"},       {"_kb", "KiB"}, {"_mb", "MiB"}, {"_gb", "GiB"},
                                      {"_bytes", "bytes"}, {"_mbit", "Mbit/s"}};
    if (e->unit) return e->unit;
    size_t l = strlen(e->name);
    for (size_t i = 0; i < sizeof suffix / sizeof suffix[0]; i++) {
        size_t k = strlen(suffix[i][0]);
        if (l > k && !strcmp(e->name + l - k, suffix[i][0])) return suffix[i][1];
    }
    return "";
}

/* A bound as text: integers in full (never 1.67772e+07), floats short. */
static void fmt_bound(const dl_cfg_entry *e, double x, char *buf, size_t cap)
{
    if (e->type == DL_CFG_INT) {
        snprintf(buf, cap, "%.0f", x);
        return;
    }
    /* %g, with its exponent short: 1e+09 -> 1e9, 1e-06 -> 1e-6 */
    char tmp[40], *o = buf;
    snprintf(tmp, sizeof tmp, "%g", x);
    for (const char *p = tmp; *p && (size_t)(o - buf) + 1 < cap; p++) {
        *o++ = *p;
        if (*p != 'e') continue;
        if (p[1] == '+') p++;
        else if (p[1] == '-') *o++ = *++p;
        while (p[1] == '0' && p[2]) p++;
    }
    *o = 0;
}

static int choice_ok(const char *choices, const char *v)
{
    size_t vl = strlen(v);
    const char *p = choices;
    while (*p) {
        const char *bar = strchr(p, '|');
        size_t l = bar ? (size_t)(bar - p) : strlen(p);
        if (l == vl && strncmp(p, v, l) == 0) return 1;
        if (!bar) break;
        p = bar + 1;
    }
    return 0;
}

static int set_entry(const dl_cfg_entry *e, void *obj, const char *v)
{
    char *field = (char *)obj + e->offset;
    char *end = NULL;
    switch (e->type) {
    case DL_CFG_INT: {
        errno = 0;
        long long x = strtoll(v, &end, 0);
        if (errno || end == v || *end)
            return dl_err(DL_EINVAL, "option %s: '%s' is not an integer", e->name, v);
        if ((double)x < e->min || (double)x > e->max) {
            char lo[32], hi[32];
            fmt_bound(e, e->min, lo, sizeof lo), fmt_bound(e, e->max, hi, sizeof hi);
            return dl_err(DL_ERANGE, "option %s: %lld out of range [%s, %s]", e->name, x, lo, hi);
        }
        *(int64_t *)field = x;
        return 0;
    }
    case DL_CFG_FLOAT: {
        errno = 0;
        double x = strtod(v, &end);
        if (errno || end == v || *end || !isfinite(x))
            return dl_err(DL_EINVAL, "option %s: '%s' is not a finite number", e->name, v);
        if (x < e->min || x > e->max) {
            char lo[40], hi[40];
            fmt_bound(e, e->min, lo, sizeof lo), fmt_bound(e, e->max, hi, sizeof hi);
            return dl_err(DL_ERANGE, "option %s: %g out of range [%s, %s]", e->name, x, lo, hi);
        }
        *(double *)field = x;
        return 0;
    }
    case DL_CFG_STR:
        if (strlen(v) >= DL_CFG_STRLEN)
            return dl_err(DL_ERANGE, "option %s: value longer than %d bytes", e->name, DL_CFG_STRLEN - 1);
        snprintf(field, DL_CFG_STRLEN, "%s", v);
        return 0;
    case DL_CFG_ENUM:
        if (!choice_ok(e->choices, v))
            return dl_err(DL_EINVAL, "option %s: '%s' is not one of %s", e->name, v, e->choices);
        snprintf(field, DL_CFG_STRLEN, "%s", v);
        return 0;
    case DL_CFG_BOOL:
        if (!strcasecmp(v, "1") || !strcasecmp(v, "true") || !strcasecmp(v, "yes") || !strcasecmp(v, "on"))
            *(int *)field = 1;
        else if (!strcasecmp(v, "0") || !strcasecmp(v, "false") || !strcasecmp(v, "no") || !strcasecmp(v, "off"))
            *(int *)field = 0;
        else
            return dl_err(DL_EINVAL, "option %s: '%s' is not a boolean (true/false)", e->name, v);
        return 0;
    }
    return dl_err(DL_EINVAL, "option %s: bad table entry", e->name);
}

int dl_cfg_defaults(const dl_cfg_entry *t, size_t n, void *obj)
{
    for (size_t i = 0; i < n; i++) {
        int rc = set_entry(&t[i], obj, t[i].def);
        if (rc) return rc;
    }
    return 0;
}

int dl_cfg_set(const dl_cfg_entry *t, size_t n, void *obj, const char *name, const char *value)
{
    const dl_cfg_entry *e = dl_cfg_find(t, n, name);
    if (!e) return dl_err(DL_EINVAL, "unknown option '%s' (see --help)", name);
    return set_entry(e, obj, value);
}

static char *trim(char *s)
{
    while (isspace((unsigned char)*s)) s++;
    char *e = s + strlen(s);
    while (e > s && isspace((unsigned char)e[-1])) *--e = 0;
    return s;
}

int dl_ini_open(dl_ini *r, const char *path)
{
    memset(r, 0, sizeof *r);
    r->path = path;
    r->f = fopen(path, "r");
    if (!r->f) return dl_err(DL_EIO, "config file %s: %s", path, strerror(errno));
    return 0;
}

void dl_ini_close(dl_ini *r)
{
    if (r->f) fclose(r->f);
    r->f = NULL;
}

/* Cut the line at its first '#' or ';' outside double quotes. */
static void cut_comment(char *s)
{
    int q = 0;
    for (; *s; s++) {
        if (q && *s == '\\' && s[1]) s++;
        else if (*s == '"') q = !q;
        else if (!q && (*s == '#' || *s == ';')) {
            *s = 0;
            return;
        }
    }
}

/* A value in quotes, unescaped in place; NULL when the quotes are broken. */
static char *unquote(char *v)
{
    size_t l = strlen(v);
    if (l < 2 || v[l - 1] != '"') return NULL;
    char *o = v;
    for (char *p = v + 1; p < v + l - 1; p++) {
        if (*p == '"') return NULL; /* an inner quote must be escaped */
        if (*p == '\\' && p + 1 < v + l - 1) {
            p++;
            *o++ = *p == 'n' ? '\n' : *p == 't' ? '\t' : *p == 'r' ? '\r' : *p;
        } else if (*p == '\\') {
            return NULL; /* the closing quote is escaped */
        } else {
            *o++ = *p;
        }
    }
    *o = 0;
    return v;
}

int dl_ini_next(dl_ini *r, char **a, char **b)
{
    while (fgets(r->buf, sizeof r->buf, r->f)) {
        r->line++;
        if (!strchr(r->buf, '\n') && !feof(r->f))
            return dl_err(DL_EINVAL, "%s:%d: line longer than %zu bytes", r->path, r->line, sizeof r->buf - 2);
        cut_comment(r->buf);
        char *s = trim(r->buf);
        if (!*s) continue;
        if (*s == '[') {
            char *close = strchr(s, ']');
            if (!close || close[1]) return dl_err(DL_EINVAL, "%s:%d: malformed section header", r->path, r->line);
            *close = 0;
            *a = trim(s + 1);
            return DL_INI_SECTION;
        }
        char *eq = strchr(s, '=');
        if (!eq) return dl_err(DL_EINVAL, "%s:%d: expected 'key = value'", r->path, r->line);
        *eq = 0;
        *a = trim(s);
        *b = trim(eq + 1);
        if (**b == '"' && !(*b = unquote(*b)))
            return dl_err(DL_EINVAL, "%s:%d: %s: unbalanced quotes (a quoted value escapes \" and \\ as \\\" and \\\\)",
                          r->path, r->line, *a);
        return DL_INI_KEY;
    }
    if (ferror(r->f)) return dl_err(DL_EIO, "%s:%d: read error", r->path, r->line);
    return DL_INI_END;
}

int dl_cfg_load_ini(const dl_cfg_entry *t, size_t n, void *obj, const char *path)
{
    dl_ini r;
    DL_TRY(dl_ini_open(&r, path));
    char section[128] = "", *a, *b;
    int rc;
    while ((rc = dl_ini_next(&r, &a, &b)) > 0) {
        if (rc == DL_INI_SECTION) {
            snprintf(section, sizeof section, "%s", a);
            continue;
        }
        char key[300];
        if (section[0]) snprintf(key, sizeof key, "%s.%s", section, a);
        else snprintf(key, sizeof key, "%s", a);
        if ((rc = dl_cfg_set(t, n, obj, key, b))) {
            char msg[512];
            snprintf(msg, sizeof msg, "%s", dl_errmsg());
            rc = dl_err(rc, "%s:%d: %s", path, r.line, msg);
            break;
        }
    }
    dl_ini_close(&r);
    return rc < 0 ? rc : 0;
}

/* argv[i] as "--name[=value]": the name into name (dashes kept), the value
 * or NULL; 0, or -1 when it is not an option. */
static int split_flag(const char *arg, char *name, size_t cap, const char **val)
{
    if (strncmp(arg, "--", 2) != 0) return -1;
    arg += 2;
    const char *eq = strchr(arg, '=');
    size_t l = eq ? (size_t)(eq - arg) : strlen(arg);
    if (l >= cap) l = cap - 1;
    memcpy(name, arg, l);
    name[l] = 0;
    *val = eq ? eq + 1 : NULL;
    return 0;
}

static _Thread_local int help_all; /* the last parse saw --help-all */

int dl_cfg_help_all(void) { return help_all; }

int dl_cfg_parse_args(const dl_cfg_entry *t, size_t n, void *obj, int argc, char **argv)
{
    DL_TRY(dl_cfg_defaults(t, n, obj));
    int print = 0;
    char name[128];
    const char *val;
    /* --config first, so flags override the file wherever they appear */
    help_all = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) return DL_CFG_HELP;
        if (!strcmp(argv[i], "--help-all") || !strcmp(argv[i], "--help_all")) {
            help_all = 1;
            return DL_CFG_HELP;
        }
        if (split_flag(argv[i], name, sizeof name, &val) || !name_eq(name, "config")) continue;
        if (!val && i + 1 >= argc) return dl_err(DL_EINVAL, "--config needs a file");
        DL_TRY(dl_cfg_load_ini(t, n, obj, val ? val : argv[i + 1]));
    }
    for (int i = 1; i < argc; i++) {
        if (split_flag(argv[i], name, sizeof name, &val))
            return dl_err(DL_EINVAL, "unexpected argument '%s' (options are --name value)", argv[i]);
        if (name_eq(name, "config")) {
            i += !val;
            continue;
        }
        if (name_eq(name, "print_config") && !val) {
            print = 1;
            continue;
        }
        const dl_cfg_entry *e = dl_cfg_find(t, n, name);
        if (!e) return dl_err(DL_EINVAL, "unknown option '--%s' (see --help)", name);
        if (!val) {
            if (e->type == DL_CFG_BOOL && (i + 1 >= argc || !strncmp(argv[i + 1], "--", 2) ||
                                           !choice_ok("0|1|true|false|yes|no|on|off", argv[i + 1]))) {
                val = "true";
            } else {
                if (i + 1 >= argc) return dl_err(DL_EINVAL, "option --%s needs a value", name);
                val = argv[++i];
            }
        }
        DL_TRY(set_entry(e, obj, val));
    }
    return print ? DL_CFG_PRINT : 0;
}

static int main_bad(const dl_cfg_main *m, int rc)
{
    fprintf(stderr, "%s: bad configuration: %s%s%s\n", m->prog, dl_strerror(rc), dl_errmsg()[0] ? ": " : "",
            dl_errmsg());
    return 2;
}

int dl_cfg_main_parse(const dl_cfg_entry *t, size_t n, void *obj, const dl_cfg_main *m, int argc, char **argv,
                      int *exit_code)
{
    int rc = dl_cfg_parse_args(t, n, obj, argc, argv);
    *exit_code = 0;
    if (rc == DL_CFG_HELP) {
        if (m->usage) fputs(m->usage, stdout);
        if (m->options) m->options(stdout);
        else dl_cfg_usage(t, n, stdout);
        return 1;
    }
    if (rc == DL_CFG_PRINT) {
        if (m->check && (rc = m->check(obj))) {
            *exit_code = main_bad(m, rc);
            return 1;
        }
        dl_cfg_print(t, n, obj, stdout);
        return 1;
    }
    if (rc) {
        *exit_code = main_bad(m, rc);
        return 1;
    }
    return 0;
}

void dl_cfg_format(const dl_cfg_entry *e, const void *obj, char *buf, size_t cap)
{
    const char *field = (const char *)obj + e->offset;
    switch (e->type) {
    case DL_CFG_INT: snprintf(buf, cap, "%lld", (long long)*(const int64_t *)field); break;
    case DL_CFG_FLOAT: {
        /* the shortest of %.15g / %.17g that reads back as the same double */
        double x = *(const double *)field;
        snprintf(buf, cap, "%.15g", x);
        if (strtod(buf, NULL) != x) snprintf(buf, cap, "%.17g", x);
        break;
    }
    case DL_CFG_STR:
    case DL_CFG_ENUM: snprintf(buf, cap, "%s", field); break;
    case DL_CFG_BOOL: snprintf(buf, cap, "%s", *(const int *)field ? "true" : "false"); break;
    }
}

/* Print `text` wrapped at `width` columns, each line indented by `indent`. */
static void wrap(FILE *f, const char *text, int indent, int width)
{
    const char *p = text;
    while (*p) {
        int room = width - indent, l = (int)strlen(p);
        if (l > room) {
            int cut = room;
            while (cut > 0 && p[cut] != ' ') cut--;
            l = cut > 0 ? cut : room;
        }
        fprintf(f, "%*s%.*s\n", indent, "", l, p);
        p += l;
        while (*p == ' ') p++;
    }
}

/* One entry a block: "--name <type, unit>" (flags) or "name <...>" (file
 * keys), then default, range or choices, reloadability (flags), help. */
static void usage_entries(const dl_cfg_entry *t, size_t n, int flags, FILE *f)
{
    static const char *types[] = {"int", "float", "text", "choice", "bool"};
    for (size_t i = 0; i < n; i++) {
        const dl_cfg_entry *e = &t[i];
        const char *u = dl_cfg_unit(e);
        char lo[32], hi[32], what[160];
        int k = 0;
        k += snprintf(what + k, sizeof what - (size_t)k, "%s%s%s", types[e->type], *u ? ", " : "", u);
        fprintf(f, "\n  %s%s <%s>\n", flags ? "--" : "", e->name, what);
        fprintf(f, "      default %s", e->def[0] ? e->def : "\"\"");
        if (e->type == DL_CFG_INT || e->type == DL_CFG_FLOAT) {
            fmt_bound(e, e->min, lo, sizeof lo), fmt_bound(e, e->max, hi, sizeof hi);
            fprintf(f, " | range %s .. %s", lo, hi);
        } else if (e->type == DL_CFG_ENUM) {
            fprintf(f, " | one of %s", e->choices);
        }
        if (flags) fprintf(f, " | %s", e->reloadable ? "reloadable (SIGHUP)" : "restart to change");
        fputc('\n', f);
        wrap(f, e->help, 6, 100);
    }
}

static void usage_preamble(FILE *f)
{
    fprintf(f, "options: --name VALUE or --name=VALUE ('-' and '_' are the same in names: --log-level is\n"
               "--log_level); a bare --name sets a bool to true. --config FILE reads 'name = value' lines first\n"
               "(INI; a dotted name a.b is 'b = ...' under '[a]'), flags override it. --print-config prints the\n"
               "effective config in that format and exits; -h/--help prints this.\n");
}

void dl_cfg_usage(const dl_cfg_entry *t, size_t n, FILE *f)
{
    usage_preamble(f);
    usage_entries(t, n, 1, f);
}

/* 1 when the space-separated list `names` holds `name` exactly. */
static int names_has(const char *names, const char *name)
{
    size_t l = strlen(name);
    for (const char *p = names; *p;) {
        while (*p == ' ') p++;
        size_t k = strcspn(p, " ");
        if (k == l && !strncmp(p, name, l)) return 1;
        p += k;
    }
    return 0;
}

/* The section index of entry e, or nsec when no section names it. */
static size_t section_of(const dl_cfg_entry *e, const dl_cfg_section *sec, size_t nsec)
{
    for (size_t s = 0; s < nsec; s++)
        if (names_has(sec[s].names, e->name)) return s;
    return nsec;
}

/* One line: "  --name <type> = default   help up to its first ';' (cut at a word to fit)". */
static void usage_brief(const dl_cfg_entry *e, FILE *f)
{
    static const char *types[] = {"int", "float", "text", "choice", "bool"};
    char left[96], help[128];
    snprintf(left, sizeof left, "--%s <%s> = %s", e->name, types[e->type], e->def[0] ? e->def : "\"\"");
    size_t k = strcspn(e->help, ";");
    /* a clause cut inside parentheses ends before them */
    int open = 0;
    size_t paren = k;
    for (size_t i = 0; i < k; i++) {
        if (e->help[i] == '(' && !open++) paren = i;
        else if (e->help[i] == ')' && open) open--;
    }
    if (open) k = paren;
    while (k > 0 && e->help[k - 1] == ' ') k--;
    int room = 100 - 2 - (strlen(left) < 44 ? 44 : (int)strlen(left) + 1);
    if (room < 20) room = 20;
    if ((int)k > room) {
        k = (size_t)room - 3;
        while (k > 0 && e->help[k] != ' ') k--;
        snprintf(help, sizeof help, "%.*s ...", (int)k, e->help);
    } else {
        snprintf(help, sizeof help, "%.*s", (int)k, e->help);
    }
    fprintf(f, "  %-43s %s\n", left, help);
}

void dl_cfg_usage_sections(const dl_cfg_entry *t, size_t n, const dl_cfg_section *sec, size_t nsec, FILE *f)
{
    int all = help_all;
    /* a section naming no option is a bug of the program's table: say so
     * where a test sees it (stderr), and print every option anyway */
    if (dl_cfg_sections_check(t, n, sec, nsec)) fprintf(stderr, "bad --help sections: %s\n", dl_errmsg());
    usage_preamble(f);
    if (!all)
        fprintf(f, "The common options first, in full; the others one line each under their heading\n"
                   "(--help-all: every option in full).\n");
    for (size_t s = 0; s <= nsec; s++) {
        size_t count = 0;
        for (size_t i = 0; i < n; i++) count += section_of(&t[i], sec, nsec) == s;
        if (!count) continue;
        fprintf(f, "\n%s:\n", s < nsec ? sec[s].title : "other options");
        /* in the section's order, then (other options) in table order */
        if (s < nsec) {
            for (const char *p = sec[s].names; *p;) {
                while (*p == ' ') p++;
                size_t k = strcspn(p, " ");
                for (size_t i = 0; k && i < n; i++) {
                    if (strlen(t[i].name) != k || strncmp(t[i].name, p, k)) continue;
                    if (s == 0 || all) usage_entries(&t[i], 1, 1, f);
                    else usage_brief(&t[i], f);
                }
                p += k;
            }
        } else {
            for (size_t i = 0; i < n; i++) {
                if (section_of(&t[i], sec, nsec) != nsec) continue;
                if (all) usage_entries(&t[i], 1, 1, f);
                else usage_brief(&t[i], f);
            }
        }
    }
}

int dl_cfg_sections_check(const dl_cfg_entry *t, size_t n, const dl_cfg_section *sec, size_t nsec)
{
    for (size_t s = 0; s < nsec; s++) {
        for (const char *p = sec[s].names; *p;) {
            while (*p == ' ') p++;
            size_t k = strcspn(p, " ");
            if (!k) break;
            char name[128];
            snprintf(name, sizeof name, "%.*s", (int)k, p);
            const dl_cfg_entry *e = NULL;
            for (size_t i = 0; i < n && !e; i++)
                if (!strcmp(t[i].name, name)) e = &t[i];
            if (!e) return dl_err(DL_EINVAL, "--help section '%s' names '%s', which is no option", sec[s].title, name);
            for (size_t o = 0; o < s; o++)
                if (names_has(sec[o].names, name))
                    return dl_err(DL_EINVAL, "option '%s' is in two --help sections ('%s' and '%s')", name,
                                  sec[o].title, sec[s].title);
            if (names_has(p + k, name))
                return dl_err(DL_EINVAL, "option '%s' is twice in --help section '%s'", name, sec[s].title);
            p += k;
        }
    }
    return 0;
}

void dl_cfg_usage_keys(const dl_cfg_entry *t, size_t n, FILE *f) { usage_entries(t, n, 0, f); }

/* A string as an INI value that dl_ini_next reads back unchanged: bare when
 * it can be, else quoted with \" \\ \n \t \r escaped. */
static void put_value(FILE *f, const char *v)
{
    size_t l = strlen(v);
    int bare = l > 0 && !isspace((unsigned char)v[0]) && !isspace((unsigned char)v[l - 1]) && v[0] != '"' &&
               !strpbrk(v, "#;\"\n\r\t");
    if (bare) {
        fputs(v, f);
        return;
    }
    fputc('"', f);
    for (const char *p = v; *p; p++) {
        if (*p == '"' || *p == '\\') fputc('\\', f), fputc(*p, f);
        else if (*p == '\n') fputs("\\n", f);
        else if (*p == '\t') fputs("\\t", f);
        else if (*p == '\r') fputs("\\r", f);
        else fputc(*p, f);
    }
    fputc('"', f);
}

void dl_cfg_print(const dl_cfg_entry *t, size_t n, const void *obj, FILE *f)
{
    char buf[DL_CFG_STRLEN + 32];
    /* pass 0: names without a dot; then each section once, in table order */
    for (size_t s = 0; s <= n; s++) {
        const char *sec = NULL;
        size_t sl = 0;
        if (s > 0) {
            const char *dot = strchr(t[s - 1].name, '.');
            if (!dot) continue;
            sl = (size_t)(dot - t[s - 1].name);
            int seen = 0;
            for (size_t j = 0; j + 1 < s && !seen; j++)
                seen = !strncmp(t[j].name, t[s - 1].name, sl + 1);
            if (seen) continue;
            sec = t[s - 1].name;
            fprintf(f, "\n[%.*s]\n", (int)sl, sec);
        }
        for (size_t i = 0; i < n; i++) {
            const char *dot = strchr(t[i].name, '.');
            if (sec ? !(dot && (size_t)(dot - t[i].name) == sl && !strncmp(t[i].name, sec, sl)) : dot != NULL)
                continue;
            dl_cfg_format(&t[i], obj, buf, sizeof buf);
            fprintf(f, "%s = ", sec ? t[i].name + sl + 1 : t[i].name);
            if (t[i].type == DL_CFG_STR) put_value(f, buf);
            else fputs(buf, f);
            fputc('\n', f);
        }
    }
}

static size_t field_size(const dl_cfg_entry *e)
{
    switch (e->type) {
    case DL_CFG_INT: return sizeof(int64_t);
    case DL_CFG_FLOAT: return sizeof(double);
    case DL_CFG_BOOL: return sizeof(int);
    case DL_CFG_STR:
    case DL_CFG_ENUM: return DL_CFG_STRLEN;
    }
    return 0;
}

int dl_cfg_reload_plan(const dl_cfg_entry *t, size_t n, const void *cur, const void *next, void *out,
                       unsigned char *what)
{
    char a[DL_CFG_STRLEN + 32], b[DL_CFG_STRLEN + 32];
    int applied = 0;
    for (size_t i = 0; i < n; i++) {
        dl_cfg_format(&t[i], cur, a, sizeof a);
        dl_cfg_format(&t[i], next, b, sizeof b);
        what[i] = DL_CFG_KEEP;
        if (!strcmp(a, b)) continue;
        if (!t[i].reloadable) {
            what[i] = DL_CFG_IGNORE;
            continue;
        }
        memcpy((char *)out + t[i].offset, (const char *)next + t[i].offset, field_size(&t[i]));
        what[i] = DL_CFG_APPLY;
        applied++;
    }
    return applied;
}

int dl_cfg_diff(const dl_cfg_entry *t, size_t n, const unsigned char *what, int kind, const void *a, const void *b,
                char *buf, size_t cap)
{
    char x[DL_CFG_STRLEN + 32], y[DL_CFG_STRLEN + 32];
    int k = 0;
    size_t len = 0;
    buf[0] = 0;
    for (size_t i = 0; i < n; i++) {
        if (what[i] != kind) continue;
        dl_cfg_format(&t[i], a, x, sizeof x);
        dl_cfg_format(&t[i], b, y, sizeof y);
        int w = snprintf(buf + len, cap - len, "%s%s %s -> %s", k ? ", " : "", t[i].name, x, y);
        k++;
        if (w < 0 || (size_t)w >= cap - len) {
            len = cap - 1; /* cut: the count stays right */
            continue;
        }
        len += (size_t)w;
    }
    return k;
}
