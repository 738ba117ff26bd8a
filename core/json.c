/* JSON (core/json.h): the strict cursor, the tree built with it, and the
 * writer. The cursor is the one reader: the tree and model files use it. */
#include "core/json.h"

#include "core/err.h"

#include <assert.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------ the cursor */

void dl_json_cur_init(dl_json_cur *j, const char *text, size_t len, const char *what)
{
    *j = (dl_json_cur){text, text + len, text, what};
}

int dl_json_fail(dl_json_cur *j, const char *why)
{
    return dl_err(DL_EFORMAT, "%s: bad JSON at byte %ld: %s", j->what, (long)(j->p - j->start), why);
}

void dl_json_ws(dl_json_cur *j)
{
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r')) j->p++;
}

int dl_json_peek(dl_json_cur *j)
{
    dl_json_ws(j);
    return j->p < j->end ? (unsigned char)*j->p : -1;
}

int dl_json_expect(dl_json_cur *j, char c)
{
    if (dl_json_peek(j) != (unsigned char)c) {
        char why[32];
        snprintf(why, sizeof why, "expected '%c'", c);
        return dl_json_fail(j, why);
    }
    j->p++;
    return 0;
}

static int hexval(int c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* dl_json_string, and with `need` the decoded length in bytes (the tree
 * measures a string before it allocates it). */
static int string_at(dl_json_cur *j, char *out, size_t cap, int *trunc, size_t *need)
{
    if (dl_json_peek(j) != '"') return dl_json_fail(j, "expected a string");
    j->p++;
    size_t n = 0, total = 0;
    if (trunc) *trunc = 0;
    for (;;) {
        if (j->p >= j->end) return dl_json_fail(j, "unterminated string");
        unsigned char c = (unsigned char)*j->p++;
        if (c == '"') break;
        if (c < 0x20) return dl_json_fail(j, "control character in a string");
        char enc[4];
        int ne = 1;
        enc[0] = (char)c;
        if (c == '\\') {
            if (j->p >= j->end) return dl_json_fail(j, "unterminated escape");
            char e = *j->p++;
            switch (e) {
            case '"': case '\\': case '/': enc[0] = e; break;
            case 'b': enc[0] = '\b'; break;
            case 'f': enc[0] = '\f'; break;
            case 'n': enc[0] = '\n'; break;
            case 'r': enc[0] = '\r'; break;
            case 't': enc[0] = '\t'; break;
            case 'u': {
                if (j->end - j->p < 4) return dl_json_fail(j, "short \\u escape");
                unsigned v = 0;
                for (int k = 0; k < 4; k++) {
                    int h = hexval((unsigned char)j->p[k]);
                    if (h < 0) return dl_json_fail(j, "bad \\u escape");
                    v = v * 16 + (unsigned)h;
                }
                j->p += 4;
                if (v >= 0xd800 && v <= 0xdfff) {
                    enc[0] = '?'; /* a surrogate half: names never need one; kept as '?' */
                } else if (v < 0x80) {
                    if (v == 0) return dl_json_fail(j, "NUL in a string");
                    enc[0] = (char)v;
                } else if (v < 0x800) {
                    enc[0] = (char)(0xc0 | (v >> 6));
                    enc[1] = (char)(0x80 | (v & 0x3f));
                    ne = 2;
                } else {
                    enc[0] = (char)(0xe0 | (v >> 12));
                    enc[1] = (char)(0x80 | ((v >> 6) & 0x3f));
                    enc[2] = (char)(0x80 | (v & 0x3f));
                    ne = 3;
                }
                break;
            }
            default: return dl_json_fail(j, "bad escape");
            }
        }
        total += (size_t)ne;
        if (out) {
            if (n + (size_t)ne < cap) {
                memcpy(out + n, enc, (size_t)ne);
                n += (size_t)ne;
            } else if (trunc) {
                *trunc = 1;
            }
        }
    }
    if (out && cap) out[n] = 0;
    if (need) *need = total;
    return 0;
}

int dl_json_string(dl_json_cur *j, char *out, size_t cap, int *trunc) { return string_at(j, out, cap, trunc, NULL); }

int dl_json_uint(dl_json_cur *j, uint64_t *out)
{
    dl_json_ws(j);
    const char *s = j->p;
    uint64_t v = 0;
    while (j->p < j->end && *j->p >= '0' && *j->p <= '9') {
        v = v * 10 + (uint64_t)(*j->p - '0');
        if (v >= (1ull << 53)) return dl_json_fail(j, "integer too large");
        j->p++;
    }
    if (j->p == s) return dl_json_fail(j, "expected a non-negative integer");
    if (j->p - s > 1 && *s == '0') return dl_json_fail(j, "integer with a leading zero");
    if (j->p < j->end && (*j->p == '.' || *j->p == 'e' || *j->p == 'E' || *j->p == '-'))
        return dl_json_fail(j, "expected an integer");
    *out = v;
    return 0;
}

/* Past a number at the cursor: -?digits(.digits)?([eE][+-]?digits)?. */
static int scan_number(dl_json_cur *j)
{
    if (j->p < j->end && *j->p == '-') j->p++;
    int digits = 0;
    while (j->p < j->end && *j->p >= '0' && *j->p <= '9') j->p++, digits++;
    if (!digits) return dl_json_fail(j, "expected a value");
    if (j->p < j->end && *j->p == '.') {
        j->p++;
        digits = 0;
        while (j->p < j->end && *j->p >= '0' && *j->p <= '9') j->p++, digits++;
        if (!digits) return dl_json_fail(j, "bad number");
    }
    if (j->p < j->end && (*j->p == 'e' || *j->p == 'E')) {
        j->p++;
        if (j->p < j->end && (*j->p == '+' || *j->p == '-')) j->p++;
        digits = 0;
        while (j->p < j->end && *j->p >= '0' && *j->p <= '9') j->p++, digits++;
        if (!digits) return dl_json_fail(j, "bad number");
    }
    return 0;
}

int dl_json_number(dl_json_cur *j, double *out)
{
    dl_json_ws(j);
    const char *s = j->p;
    DL_TRY(scan_number(j));
    /* strtod needs a terminated copy: the text is not a C string */
    size_t n = (size_t)(j->p - s);
    char tmp[64], *b = n < sizeof tmp ? tmp : dl_xmalloc(n + 1);
    memcpy(b, s, n);
    b[n] = 0;
    *out = strtod(b, NULL);
    if (b != tmp) free(b);
    return 0;
}

int dl_json_skip(dl_json_cur *j, int depth)
{
    if (depth > DL_JSON_DEPTH_MAX) return dl_json_fail(j, "nested too deep");
    int c = dl_json_peek(j);
    if (c == '"') return dl_json_string(j, NULL, 0, NULL);
    if (c == '{' || c == '[') {
        char close = c == '{' ? '}' : ']';
        j->p++;
        if (dl_json_peek(j) == close) {
            j->p++;
            return 0;
        }
        for (;;) {
            if (c == '{') {
                DL_TRY(dl_json_string(j, NULL, 0, NULL));
                DL_TRY(dl_json_expect(j, ':'));
            }
            DL_TRY(dl_json_skip(j, depth + 1));
            int d = dl_json_peek(j);
            if (d < 0) return dl_json_fail(j, "unexpected end");
            j->p++;
            if (d == close) return 0;
            if (d != ',') return dl_json_fail(j, "expected ',' or a closing bracket");
        }
    }
    const char *lits[] = {"true", "false", "null"};
    for (int k = 0; k < 3; k++) {
        size_t n = strlen(lits[k]);
        if ((size_t)(j->end - j->p) >= n && !memcmp(j->p, lits[k], n)) {
            j->p += n;
            return 0;
        }
    }
    return scan_number(j);
}

/* ------------------------------------------------------------ the tree */

static int tree_string(dl_json_cur *j, char **out)
{
    const char *at = j->p;
    size_t need = 0;
    DL_TRY(string_at(j, NULL, 0, NULL, &need)); /* checked and measured */
    j->p = at;
    *out = dl_xmalloc(need + 1);
    return string_at(j, *out, need + 1, NULL, NULL);
}

static int tree_val(dl_json_cur *j, dl_json **out, int depth)
{
    if (depth > DL_JSON_DEPTH_MAX) return dl_json_fail(j, "nested too deep");
    int c = dl_json_peek(j);
    if (c < 0) return dl_json_fail(j, "unexpected end");
    dl_json *n = dl_xcalloc(1, sizeof *n);
    *out = n;
    if (c == '{' || c == '[') {
        char close = c == '{' ? '}' : ']';
        n->type = c == '{' ? DL_JSON_OBJ : DL_JSON_ARR;
        j->p++;
        if (dl_json_peek(j) == close) {
            j->p++;
            return 0;
        }
        dl_json **tail = &n->child;
        for (;;) {
            char *key = NULL;
            if (c == '{') {
                DL_TRY(tree_string(j, &key));
                int rc = dl_json_expect(j, ':');
                if (rc) {
                    free(key);
                    return rc;
                }
            }
            dl_json *v = NULL;
            int rc = tree_val(j, &v, depth + 1);
            if (!v) {
                free(key);
                return rc;
            }
            v->key = key; /* linked even when it failed: the caller frees the tree */
            *tail = v;
            tail = &v->next;
            if (rc) return rc;
            int d = dl_json_peek(j);
            if (d < 0) return dl_json_fail(j, "unexpected end");
            j->p++;
            if (d == close) return 0;
            if (d != ',') return dl_json_fail(j, "expected ',' or a closing bracket");
        }
    }
    if (c == '"') {
        n->type = DL_JSON_STR;
        return tree_string(j, &n->str);
    }
    static const struct {
        const char *w;
        dl_json_type t;
        double v;
    } words[] = {{"true", DL_JSON_BOOL, 1}, {"false", DL_JSON_BOOL, 0}, {"null", DL_JSON_NULL, 0}};
    for (size_t k = 0; k < 3; k++) {
        size_t l = strlen(words[k].w);
        if ((size_t)(j->end - j->p) >= l && !memcmp(j->p, words[k].w, l)) {
            n->type = words[k].t;
            n->num = words[k].v;
            j->p += l;
            return 0;
        }
    }
    n->type = DL_JSON_NUM;
    return dl_json_number(j, &n->num);
}

int dl_json_parse(const char *text, size_t len, dl_json **out)
{
    dl_json_cur j;
    dl_json_cur_init(&j, text, len, "JSON document");
    *out = NULL;
    dl_json *t = NULL;
    int rc = tree_val(&j, &t, 0);
    if (!rc) {
        dl_json_ws(&j);
        if (j.p != j.end) rc = dl_json_fail(&j, "bytes after the document");
    }
    if (rc) {
        dl_json_free(&t);
        return rc;
    }
    *out = t;
    return 0;
}

static void free_node(dl_json *j)
{
    while (j) {
        dl_json *n = j->next;
        free_node(j->child);
        free(j->str);
        free(j->key);
        free(j);
        j = n;
    }
}

void dl_json_free(dl_json **j)
{
    if (!j) return;
    free_node(*j);
    *j = NULL;
}

const dl_json *dl_json_get(const dl_json *j, const char *key)
{
    if (!j || j->type != DL_JSON_OBJ) return NULL;
    for (const dl_json *c = j->child; c; c = c->next)
        if (c->key && !strcmp(c->key, key)) return c;
    return NULL;
}

double dl_json_num(const dl_json *j, const char *key, double def)
{
    const dl_json *v = dl_json_get(j, key);
    return v && (v->type == DL_JSON_NUM || v->type == DL_JSON_BOOL) ? v->num : def;
}

const char *dl_json_str(const dl_json *j, const char *key, const char *def)
{
    const dl_json *v = dl_json_get(j, key);
    return v && v->type == DL_JSON_STR ? v->str : def;
}

/* ------------------------------------------------------------ the writer */

static void w_put(dl_json_w *w, const void *data, size_t n)
{
    if (w->f) {
        fwrite(data, 1, n, w->f);
        return;
    }
    if (w->len + n + 1 > w->cap) {
        size_t cap = w->cap ? w->cap : 4096;
        while (cap < w->len + n + 1) cap *= 2;
        w->buf = dl_xrealloc(w->buf, cap);
        w->cap = cap;
    }
    memcpy(w->buf + w->len, data, n);
    w->len += n;
    w->buf[w->len] = 0;
}

void dl_json_w_raw(dl_json_w *w, const char *fmt, ...)
{
    char small[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) DL_PANIC("vsnprintf failed");
    if ((size_t)n < sizeof small) {
        w_put(w, small, (size_t)n);
        return;
    }
    char *big = dl_xmalloc((size_t)n + 1);
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    w_put(w, big, (size_t)n);
    free(big);
}

/* Length of a valid UTF-8 sequence at p, or 0. */
static int utf8_len(const unsigned char *p)
{
    unsigned c = p[0];
    int n;
    unsigned min;
    if (c >= 0xc2 && c <= 0xdf) n = 2, min = 0x80;
    else if (c >= 0xe0 && c <= 0xef) n = 3, min = 0x800;
    else if (c >= 0xf0 && c <= 0xf4) n = 4, min = 0x10000;
    else return 0;
    unsigned cp = c & (0x3f >> (n - 1));
    for (int i = 1; i < n; i++) {
        if ((p[i] & 0xc0) != 0x80) return 0;
        cp = cp << 6 | (p[i] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
    return n;
}

void dl_json_quote(const char *s, void (*put)(void *ctx, const char *b, size_t n), void *ctx)
{
    put(ctx, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)s; *p;) {
        unsigned c = *p;
        if (c == '"' || c == '\\') {
            char e[2] = {'\\', (char)c};
            put(ctx, e, 2), p++;
        } else if (c == '\n') {
            put(ctx, "\\n", 2), p++;
        } else if (c == '\r') {
            put(ctx, "\\r", 2), p++;
        } else if (c == '\t') {
            put(ctx, "\\t", 2), p++;
        } else if (c < 0x20) {
            char e[8];
            snprintf(e, sizeof e, "\\u%04x", c);
            put(ctx, e, 6), p++;
        } else if (c < 0x80) {
            put(ctx, (const char *)p, 1), p++;
        } else {
            int n = utf8_len(p);
            if (n) put(ctx, (const char *)p, (size_t)n), p += n;
            else put(ctx, "\\ufffd", 6), p++;
        }
    }
    put(ctx, "\"", 1);
}

static void w_put_cb(void *w, const char *b, size_t n) { w_put(w, b, n); }

void dl_json_w_string(dl_json_w *w, const char *s) { dl_json_quote(s, w_put_cb, w); }

void dl_json_w_key(dl_json_w *w, const char *key)
{
    if (w->depth > 0) {
        if (!w->first[w->depth]) w_put(w, ",", 1);
        if (w->inl[w->depth]) {
            if (!w->first[w->depth]) w_put(w, " ", 1);
        } else {
            w_put(w, "\n", 1);
            for (int i = 0; i < w->depth; i++) w_put(w, "  ", 2);
        }
        w->first[w->depth] = 0;
    }
    if (key) {
        dl_json_w_string(w, key);
        w_put(w, ": ", 2);
    }
}

void dl_json_w_open(dl_json_w *w, const char *key, char c, int inl)
{
    assert(w->depth + 1 < DL_JSON_DEPTH_MAX);
    dl_json_w_key(w, key);
    w_put(w, &c, 1);
    w->depth++;
    w->first[w->depth] = 1;
    w->inl[w->depth] = inl || w->inl[w->depth - 1];
}

void dl_json_w_close(dl_json_w *w, char c)
{
    int empty = w->first[w->depth], inl = w->inl[w->depth];
    w->depth--;
    if (!inl && !empty) {
        w_put(w, "\n", 1);
        for (int i = 0; i < w->depth; i++) w_put(w, "  ", 2);
    }
    w_put(w, &c, 1);
}

void dl_json_w_num(dl_json_w *w, const char *key, double v)
{
    dl_json_w_key(w, key);
    if (!isfinite(v)) w_put(w, "null", 4); /* JSON has no NaN */
    else dl_json_w_raw(w, "%.12g", v);
}

void dl_json_w_int(dl_json_w *w, const char *key, long long v)
{
    dl_json_w_key(w, key);
    dl_json_w_raw(w, "%lld", v);
}

void dl_json_w_u64(dl_json_w *w, const char *key, uint64_t v)
{
    dl_json_w_key(w, key);
    dl_json_w_raw(w, "%llu", (unsigned long long)v);
}

void dl_json_w_str(dl_json_w *w, const char *key, const char *s)
{
    dl_json_w_key(w, key);
    dl_json_w_string(w, s);
}

void dl_json_w_bool(dl_json_w *w, const char *key, int v)
{
    dl_json_w_key(w, key);
    dl_json_w_raw(w, "%s", v ? "true" : "false");
}

void dl_json_w_tri(dl_json_w *w, const char *key, int v)
{
    dl_json_w_key(w, key);
    dl_json_w_raw(w, "%s", v == 1 ? "true" : v == 0 ? "false" : "null");
}

void dl_json_w_free(dl_json_w *w)
{
    if (!w) return;
    free(w->buf);
    w->buf = NULL;
    w->len = w->cap = 0;
}
