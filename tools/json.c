/* Minimal JSON reader (see json.h): recursive descent over a bounded depth. */
#include "tools/json.h"

#include <stdlib.h>
#include <string.h>

#include "core/err.h"

typedef struct {
    const char *s;
    size_t n, i;
} rd;

#define MAX_DEPTH 32

static void ws(rd *r)
{
    while (r->i < r->n && (r->s[r->i] == ' ' || r->s[r->i] == '\t' || r->s[r->i] == '\n' || r->s[r->i] == '\r')) r->i++;
}

static int bad(rd *r, const char *what) { return dl_err(DL_EFORMAT, "JSON: %s at byte %zu", what, r->i); }

static int parse_str(rd *r, char **out)
{
    if (r->i >= r->n || r->s[r->i] != '"') return bad(r, "expected a string");
    r->i++;
    size_t cap = 16, o = 0;
    char *b = dl_xmalloc(cap);
    while (r->i < r->n && r->s[r->i] != '"') {
        char c = r->s[r->i++];
        if (c == '\\') {
            if (r->i >= r->n) break;
            char e = r->s[r->i++];
            switch (e) {
            case 'n': c = '\n'; break;
            case 't': c = '\t'; break;
            case 'r': c = '\r'; break;
            case 'b': c = '\b'; break;
            case 'f': c = '\f'; break;
            case 'u': {
                if (r->i + 4 > r->n) {
                    free(b);
                    return bad(r, "short \\u escape");
                }
                char h[5] = {r->s[r->i], r->s[r->i + 1], r->s[r->i + 2], r->s[r->i + 3], 0};
                r->i += 4;
                long v = strtol(h, NULL, 16);
                c = v > 0 && v < 0x80 ? (char)v : '?';
                break;
            }
            default: c = e; break; /* \" \\ \/ */
            }
        }
        if (o + 2 > cap) b = dl_xrealloc(b, cap *= 2);
        b[o++] = c;
    }
    if (r->i >= r->n) {
        free(b);
        return bad(r, "unterminated string");
    }
    r->i++;
    b[o] = 0;
    *out = b;
    return 0;
}

static int parse_val(rd *r, dl_json **out, int depth);

static int parse_list(rd *r, dl_json *j, int depth, char close)
{
    r->i++;
    ws(r);
    if (r->i < r->n && r->s[r->i] == close) {
        r->i++;
        return 0;
    }
    dl_json **tail = &j->child;
    for (;;) {
        ws(r);
        char *key = NULL;
        if (close == '}') {
            DL_TRY(parse_str(r, &key));
            ws(r);
            if (r->i >= r->n || r->s[r->i] != ':') {
                free(key);
                return bad(r, "expected ':'");
            }
            r->i++;
        }
        dl_json *v = NULL;
        int rc = parse_val(r, &v, depth + 1);
        if (!v) {
            free(key);
            return rc;
        }
        v->key = key; /* linked even when it failed: the caller frees the tree */
        *tail = v;
        tail = &v->next;
        if (rc) return rc;
        ws(r);
        if (r->i < r->n && r->s[r->i] == ',') {
            r->i++;
            continue;
        }
        if (r->i < r->n && r->s[r->i] == close) {
            r->i++;
            return 0;
        }
        return bad(r, "expected ',' or the end of a list");
    }
}

static int parse_val(rd *r, dl_json **out, int depth)
{
    if (depth > MAX_DEPTH) return bad(r, "nested too deep");
    ws(r);
    if (r->i >= r->n) return bad(r, "unexpected end");
    dl_json *j = dl_xcalloc(1, sizeof *j);
    *out = j;
    char c = r->s[r->i];
    if (c == '{' || c == '[') {
        j->type = c == '{' ? DL_JSON_OBJ : DL_JSON_ARR;
        return parse_list(r, j, depth, c == '{' ? '}' : ']');
    }
    if (c == '"') {
        j->type = DL_JSON_STR;
        return parse_str(r, &j->str);
    }
    static const struct {
        const char *w;
        dl_json_type t;
        double v;
    } words[] = {{"true", DL_JSON_BOOL, 1}, {"false", DL_JSON_BOOL, 0}, {"null", DL_JSON_NULL, 0}};
    for (size_t k = 0; k < 3; k++) {
        size_t l = strlen(words[k].w);
        if (r->i + l <= r->n && !memcmp(r->s + r->i, words[k].w, l)) {
            j->type = words[k].t;
            j->num = words[k].v;
            r->i += l;
            return 0;
        }
    }
    char tmp[64];
    size_t l = 0;
    while (r->i + l < r->n && l < sizeof tmp - 1 && strchr("+-0123456789.eE", r->s[r->i + l])) {
        tmp[l] = r->s[r->i + l];
        l++;
    }
    tmp[l] = 0;
    char *end;
    j->num = strtod(tmp, &end);
    if (!l || *end) return bad(r, "bad value");
    j->type = DL_JSON_NUM;
    r->i += l;
    return 0;
}

int dl_json_parse(const char *text, size_t len, dl_json **out)
{
    rd r = {text, len, 0};
    *out = NULL;
    dl_json *j = NULL;
    int rc = parse_val(&r, &j, 0);
    if (!rc) {
        ws(&r);
        if (r.i != r.n) rc = bad(&r, "trailing bytes");
    }
    if (rc) {
        dl_json_free(&j);
        return rc;
    }
    *out = j;
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
