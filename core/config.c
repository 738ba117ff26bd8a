/* Config table parsing: defaults -> INI -> flags, each value checked against
 * its entry's type and bounds so a bad value is refused with its name. */
#include "core/config.h"
#include "core/err.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <string.h>
#include <strings.h>

const dl_cfg_entry *dl_cfg_find(const dl_cfg_entry *t, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(t[i].name, name) == 0) return &t[i];
    return NULL;
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
        if ((double)x < e->min || (double)x > e->max)
            return dl_err(DL_ERANGE, "option %s: %lld out of range [%.17g, %.17g]", e->name, x, e->min, e->max);
        *(int64_t *)field = x;
        return 0;
    }
    case DL_CFG_FLOAT: {
        errno = 0;
        double x = strtod(v, &end);
        if (errno || end == v || *end || !isfinite(x))
            return dl_err(DL_EINVAL, "option %s: '%s' is not a finite number", e->name, v);
        if (x < e->min || x > e->max)
            return dl_err(DL_ERANGE, "option %s: %g out of range [%g, %g]", e->name, x, e->min, e->max);
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

int dl_cfg_load_ini(const dl_cfg_entry *t, size_t n, void *obj, const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) return dl_err(DL_EIO, "config file %s: %s", path, strerror(errno));
    char line[1024], section[128] = "";
    int lineno = 0, rc = 0;
    while (fgets(line, sizeof line, f)) {
        lineno++;
        if (!strchr(line, '\n') && !feof(f)) {
            rc = dl_err(DL_EINVAL, "%s:%d: line longer than %zu bytes", path, lineno, sizeof line - 2);
            break;
        }
        char *c = strpbrk(line, "#;");
        if (c) *c = 0;
        char *s = trim(line);
        if (!*s) continue;
        if (*s == '[') {
            char *close = strchr(s, ']');
            if (!close || close[1]) {
                rc = dl_err(DL_EINVAL, "%s:%d: malformed section header", path, lineno);
                break;
            }
            *close = 0;
            snprintf(section, sizeof section, "%s", trim(s + 1));
            continue;
        }
        char *eq = strchr(s, '=');
        if (!eq) {
            rc = dl_err(DL_EINVAL, "%s:%d: expected 'key = value'", path, lineno);
            break;
        }
        *eq = 0;
        char *k = trim(s), *v = trim(eq + 1);
        char key[300];
        if (section[0]) snprintf(key, sizeof key, "%s.%s", section, k);
        else snprintf(key, sizeof key, "%s", k);
        rc = dl_cfg_set(t, n, obj, key, v);
        if (rc) {
            char msg[512];
            snprintf(msg, sizeof msg, "%s", dl_errmsg());
            dl_err(rc, "%s:%d: %s", path, lineno, msg);
            break;
        }
    }
    fclose(f);
    return rc;
}

int dl_cfg_parse_args(const dl_cfg_entry *t, size_t n, void *obj, int argc, char **argv)
{
    DL_TRY(dl_cfg_defaults(t, n, obj));
    /* --config first, so flags override the file wherever they appear */
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) return 1;
        const char *file = NULL;
        if (!strcmp(argv[i], "--config")) {
            if (i + 1 >= argc) return dl_err(DL_EINVAL, "--config needs a file");
            file = argv[i + 1];
        } else if (!strncmp(argv[i], "--config=", 9)) {
            file = argv[i] + 9;
        }
        if (file) DL_TRY(dl_cfg_load_ini(t, n, obj, file));
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strncmp(a, "--", 2) != 0)
            return dl_err(DL_EINVAL, "unexpected argument '%s' (options are --name value)", a);
        a += 2;
        if (!strcmp(a, "config")) { i++; continue; }
        if (!strncmp(a, "config=", 7)) continue;
        char name[128];
        const char *eq = strchr(a, '=');
        const char *val = NULL;
        if (eq) {
            size_t l = (size_t)(eq - a);
            if (l >= sizeof name) return dl_err(DL_EINVAL, "option name too long: %s", argv[i]);
            memcpy(name, a, l);
            name[l] = 0;
            val = eq + 1;
        } else {
            snprintf(name, sizeof name, "%s", a);
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
    return 0;
}

void dl_cfg_format(const dl_cfg_entry *e, const void *obj, char *buf, size_t cap)
{
    const char *field = (const char *)obj + e->offset;
    switch (e->type) {
    case DL_CFG_INT: snprintf(buf, cap, "%lld", (long long)*(const int64_t *)field); break;
    case DL_CFG_FLOAT: snprintf(buf, cap, "%.9g", *(const double *)field); break;
    case DL_CFG_STR:
    case DL_CFG_ENUM: snprintf(buf, cap, "%s", field); break;
    case DL_CFG_BOOL: snprintf(buf, cap, "%s", *(const int *)field ? "true" : "false"); break;
    }
}

void dl_cfg_usage(const dl_cfg_entry *t, size_t n, FILE *f)
{
    fprintf(f, "options (also settable as 'name = value' in an INI file given by --config FILE):\n");
    for (size_t i = 0; i < n; i++) {
        const dl_cfg_entry *e = &t[i];
        char range[96] = "";
        if (e->type == DL_CFG_INT || e->type == DL_CFG_FLOAT)
            snprintf(range, sizeof range, " [%g..%g]", e->min, e->max);
        else if (e->type == DL_CFG_ENUM)
            snprintf(range, sizeof range, " {%s}", e->choices);
        fprintf(f, "  --%-22s %s (default %s)%s%s\n", e->name, e->help, e->def[0] ? e->def : "\"\"", range,
                e->reloadable ? " [reloadable]" : "");
    }
}

void dl_cfg_print(const dl_cfg_entry *t, size_t n, const void *obj, FILE *f)
{
    char buf[DL_CFG_STRLEN + 32];
    for (size_t i = 0; i < n; i++) {
        dl_cfg_format(&t[i], obj, buf, sizeof buf);
        fprintf(f, "%s = %s\n", t[i].name, buf);
    }
}
