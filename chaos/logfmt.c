/* The event-line reader (chaos/logfmt.h): a strict logfmt parser, typed
 * lookups, and a file iterator that skips and counts what is not an event. */
#include "chaos/logfmt.h"

#include "core/err.h"

#include <assert.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int key_char(unsigned char c)
{
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
}

static int ctrl_char(unsigned char c) { return c < 0x20 || c == 0x7f; }

static int hex_val(unsigned char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static int parse_fail(dl_logfmt_line *out, const char *why, size_t at)
{
    out->n = 0;
    out->cut = 0;
    out->ts = INT64_MIN;
    out->event = NULL;
    return dl_err(DL_EFORMAT, "logfmt: %s at byte %zu", why, at);
}

int dl_logfmt_parse(const char *s, size_t len, dl_logfmt_line *out)
{
    assert(s && out);
    out->n = 0;
    out->cut = 0;
    out->ts = INT64_MIN;
    out->event = NULL;
    if (len > DL_LOGFMT_LINE) return dl_err(DL_ERANGE, "logfmt: line of %zu bytes (at most %d)", len, DL_LOGFMT_LINE);
    if (len == 0) return parse_fail(out, "empty line", 0);
    /* Each field "k=v" of the input becomes "k\0v\0" in buf: the separator
     * space pays for the second NUL, so buf never needs more than len + 1
     * bytes, and escapes only shrink a value. */
    char *b = out->buf;
    size_t i = 0, o = 0;
    int n = 0;
    while (i < len) {
        if (n == DL_LOGFMT_FIELDS) return parse_fail(out, "too many fields", i);
        size_t k0 = i;
        while (i < len && key_char((unsigned char)s[i])) i++;
        if (i == k0 || i >= len || s[i] != '=') return parse_fail(out, "expected key=", k0);
        out->key[n] = b + o;
        memcpy(b + o, s + k0, i - k0);
        o += i - k0;
        b[o++] = 0;
        i++; /* '=' */
        out->val[n] = b + o;
        if (i < len && s[i] == '"') {
            i++;
            for (;;) {
                if (i >= len) return parse_fail(out, "unterminated quote", i);
                unsigned char c = (unsigned char)s[i];
                if (c == '"') {
                    i++;
                    break;
                }
                if (c == '\\') {
                    if (i + 1 >= len) return parse_fail(out, "escape at end of line", i);
                    unsigned char e = (unsigned char)s[i + 1];
                    if (e == 'n') b[o++] = '\n';
                    else if (e == 'r') b[o++] = '\r';
                    else if (e == 't') b[o++] = '\t';
                    else if (e == '"' || e == '\\') b[o++] = (char)e;
                    else if (e == 'x') {
                        int hi = i + 3 < len ? hex_val((unsigned char)s[i + 2]) : -1;
                        int lo = i + 3 < len ? hex_val((unsigned char)s[i + 3]) : -1;
                        if (hi < 0 || lo < 0) return parse_fail(out, "bad \\x escape", i);
                        /* a NUL would end the C string silently: the writer never makes one */
                        if (hi == 0 && lo == 0) return parse_fail(out, "\\x00 in a value", i);
                        b[o++] = (char)(hi * 16 + lo);
                        i += 2;
                    } else return parse_fail(out, "unknown escape", i);
                    i += 2;
                } else if (ctrl_char(c)) {
                    return parse_fail(out, "raw control byte in a quoted value", i);
                } else {
                    b[o++] = (char)c;
                    i++;
                }
            }
        } else {
            size_t v0 = i;
            while (i < len && s[i] != ' ') {
                unsigned char c = (unsigned char)s[i];
                if (c == '"' || c == '\\' || ctrl_char(c)) return parse_fail(out, "bad byte in a bare value", i);
                b[o++] = (char)c;
                i++;
            }
            if (i == v0) return parse_fail(out, "empty bare value", i);
        }
        b[o++] = 0;
        n++;
        if (i < len) {
            if (s[i] != ' ') return parse_fail(out, "expected a space after a value", i);
            i++;
            if (i == len) return parse_fail(out, "trailing space", i);
            if (s[i] == ' ') return parse_fail(out, "doubled space", i);
        }
    }
    assert(o <= sizeof out->buf);
    out->n = n;
    out->cut = !strcmp(out->key[n - 1], "cut") && !strcmp(out->val[n - 1], "1");
    int64_t ts;
    if (dl_logfmt_i64(out, "ts", &ts) == 0) out->ts = ts;
    out->event = dl_logfmt_get(out, "event");
    return 0;
}

const char *dl_logfmt_get(const dl_logfmt_line *l, const char *key)
{
    assert(l && key);
    /* from the end: a repeated key's last value wins (see the header) */
    for (int i = l->n - 1; i >= 0; i--)
        if (!strcmp(l->key[i], key)) return l->val[i];
    return NULL;
}

int dl_logfmt_i64(const dl_logfmt_line *l, const char *key, int64_t *out)
{
    const char *v = dl_logfmt_get(l, key);
    if (!v) return DL_ENOTFOUND;
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (end == v || *end || errno == ERANGE) return DL_EFORMAT;
    *out = (int64_t)x;
    return 0;
}

int dl_logfmt_u64(const dl_logfmt_line *l, const char *key, uint64_t *out)
{
    const char *v = dl_logfmt_get(l, key);
    if (!v) return DL_ENOTFOUND;
    if (v[0] == '-') return DL_EFORMAT; /* strtoull would wrap it */
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (end == v || *end || errno == ERANGE) return DL_EFORMAT;
    *out = (uint64_t)x;
    return 0;
}

int dl_logfmt_f64(const dl_logfmt_line *l, const char *key, double *out)
{
    const char *v = dl_logfmt_get(l, key);
    if (!v) return DL_ENOTFOUND;
    char *end;
    double x = strtod(v, &end);
    if (end == v || *end) return DL_EFORMAT;
    *out = x;
    return 0;
}

int64_t dl_logfmt_i64_or(const dl_logfmt_line *l, const char *key, int64_t def)
{
    int64_t x = def;
    return dl_logfmt_i64(l, key, &x) == 0 ? x : def;
}

uint64_t dl_logfmt_u64_or(const dl_logfmt_line *l, const char *key, uint64_t def)
{
    uint64_t x = def;
    return dl_logfmt_u64(l, key, &x) == 0 ? x : def;
}

double dl_logfmt_f64_or(const dl_logfmt_line *l, const char *key, double def)
{
    double x = def;
    return dl_logfmt_f64(l, key, &x) == 0 ? x : def;
}

const char *dl_logfmt_str_or(const dl_logfmt_line *l, const char *key, const char *def)
{
    const char *v = dl_logfmt_get(l, key);
    return v ? v : def;
}

/* ---- the file iterator */

struct dl_logfmt_file {
    FILE *fp;
    int64_t lineno; /* of the line last returned */
    dl_logfmt_stats st;
    char line[DL_LOGFMT_LINE + 1];
};

int dl_logfmt_open(const char *path, dl_logfmt_file **out)
{
    assert(path && out);
    *out = NULL;
    FILE *fp = fopen(path, "rb");
    if (!fp) return dl_err(errno == ENOENT ? DL_ENOTFOUND : DL_EIO, "%s: %s", path, strerror(errno));
    dl_logfmt_file *f = dl_xcalloc(1, sizeof *f);
    f->fp = fp;
    *out = f;
    return 0;
}

int dl_logfmt_next(dl_logfmt_file *f, dl_logfmt_line *line)
{
    assert(f && line);
    for (;;) {
        /* One line into f->line; bytes past the bound are read and dropped,
         * so a long line costs no memory. NUL bytes are kept (and make the
         * line garbage in the parser, as raw control bytes). */
        size_t n = 0;
        int over = 0, c;
        while ((c = getc_unlocked(f->fp)) != EOF && c != '\n') {
            if (n < DL_LOGFMT_LINE) f->line[n++] = (char)c;
            else over = 1;
        }
        if (c == EOF) {
            if (ferror(f->fp)) return dl_err(DL_EIO, "reading an event file: %s", strerror(errno));
            if (n == 0 && !over) return 0;
            /* Every line the writer makes ends in a newline written in the
             * same write(2); without one the line stopped short and its last
             * value may be cut, so it is not believed. */
            f->st.lines++;
            f->st.torn++;
            return 0;
        }
        f->st.lines++;
        if (over) {
            f->st.too_long++;
            continue;
        }
        if (dl_logfmt_parse(f->line, n, line) < 0 || line->ts == INT64_MIN || !line->event) {
            f->st.garbage++;
            continue;
        }
        f->st.events++;
        f->st.cut += line->cut;
        f->lineno = f->st.lines;
        return 1;
    }
}

int64_t dl_logfmt_lineno(const dl_logfmt_file *f) { return f->lineno; }

const dl_logfmt_stats *dl_logfmt_file_stats(const dl_logfmt_file *f) { return &f->st; }

void dl_logfmt_close(dl_logfmt_file **f)
{
    if (!f || !*f) return;
    if ((*f)->fp) fclose((*f)->fp);
    free(*f);
    *f = NULL;
}
