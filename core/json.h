/* JSON for the whole tree: one strict reader (a cursor over a bounded
 * buffer, and a tree built with it) and one writer (to a FILE or a buffer). */
#ifndef DL_CORE_JSON_H
#define DL_CORE_JSON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Containers nest at most this deep (deeper input is refused). */
#define DL_JSON_DEPTH_MAX 32

/* ---- reading: the cursor
 * A strict reader over text[0, len): no allocation, bounded depth, made for
 * hostile input (model file headers). Every failure is DL_EFORMAT with the
 * message "WHAT: bad JSON at byte N: WHY". */
typedef struct {
    const char *p, *end, *start;
    const char *what; /* names the document in messages (a file name) */
} dl_json_cur;

void dl_json_cur_init(dl_json_cur *j, const char *text, size_t len, const char *what);
/* DL_EFORMAT naming the byte the cursor is at and why. */
int dl_json_fail(dl_json_cur *j, const char *why);
/* Skip white space. */
void dl_json_ws(dl_json_cur *j);
/* The next byte after white space, or -1 at the end (not consumed). */
int dl_json_peek(dl_json_cur *j);
/* Consume byte c (after white space), or fail "expected 'c'". */
int dl_json_expect(dl_json_cur *j, char c);
/* A string into out (cap bytes with the NUL, decoded, \u as UTF-8, a
 * surrogate half as '?'); *trunc set when it did not fit (out then holds a
 * prefix). out may be NULL (skip). Control characters, bad escapes and
 * \u0000 are refused. */
int dl_json_string(dl_json_cur *j, char *out, size_t cap, int *trunc);
/* A non-negative integer (no sign, fraction or exponent, no leading zero) below 2^53. */
int dl_json_uint(dl_json_cur *j, uint64_t *out);
/* A number by the JSON grammar: -?digits(.digits)?([eE][+-]?digits)?. */
int dl_json_number(dl_json_cur *j, double *out);
/* Skip any value; depth is the nesting of the value (refused beyond DL_JSON_DEPTH_MAX). */
int dl_json_skip(dl_json_cur *j, int depth);

/* ---- reading: the tree (built with the cursor) */
typedef enum { DL_JSON_NULL, DL_JSON_BOOL, DL_JSON_NUM, DL_JSON_STR, DL_JSON_ARR, DL_JSON_OBJ } dl_json_type;

typedef struct dl_json {
    dl_json_type type;
    double num;            /* NUM; BOOL: 0 or 1 */
    char *str;             /* STR: decoded as dl_json_string does */
    char *key;             /* member name when inside an object */
    struct dl_json *child; /* ARR / OBJ: first element */
    struct dl_json *next;  /* next sibling */
} dl_json;

/* Parse text[0, len) whole. DL_EFORMAT with the byte offset on malformed
 * input (deeper than DL_JSON_DEPTH_MAX included). *out is freed with dl_json_free. */
int dl_json_parse(const char *text, size_t len, dl_json **out);
void dl_json_free(dl_json **j);
/* Member `key` of an object, NULL when absent or j is not an object. */
const dl_json *dl_json_get(const dl_json *j, const char *key);
/* Convenience: number / string of member key, or def when absent or of
 * another type. */
double dl_json_num(const dl_json *j, const char *key, double def);
const char *dl_json_str(const dl_json *j, const char *key, const char *def);

/* ---- writing
 * To a FILE (f set) or to a growing buffer (f NULL: buf[0, len), NUL-
 * terminated, freed with dl_json_w_free). The structured calls lay out a
 * document: each container on its own lines, indented two spaces a level,
 * or on one line when opened inline. Zero-initialise, set f if wanted. */
typedef struct {
    FILE *f;
    char *buf;
    size_t len, cap;
    int depth;
    int first[DL_JSON_DEPTH_MAX]; /* nothing written yet at this level */
    int inl[DL_JSON_DEPTH_MAX];   /* this level is written on one line */
} dl_json_w;

/* s as a JSON string handed to put in pieces: quotes, backslashes and
 * control bytes escaped; bytes that are not UTF-8 become U+FFFD, so the
 * output always parses. The one string escaper of every JSON writer
 * (dl_json_w_string below, core/prom.h dl_prom_json_str). */
void dl_json_quote(const char *s, void (*put)(void *ctx, const char *b, size_t n), void *ctx);
/* Text as it is (printf format). */
void dl_json_w_raw(dl_json_w *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A string, quoted: quotes, backslashes and control bytes escaped; bytes
 * that are not UTF-8 become U+FFFD, so the output always parses. */
void dl_json_w_string(dl_json_w *w, const char *s);
/* Structured: a member `key` (NULL: an array element) opening a container
 * ('{' or '['), closing it, and the values. */
void dl_json_w_open(dl_json_w *w, const char *key, char c, int inl);
void dl_json_w_close(dl_json_w *w, char c);
void dl_json_w_num(dl_json_w *w, const char *key, double v); /* %.12g; not finite: null */
void dl_json_w_int(dl_json_w *w, const char *key, long long v);
void dl_json_w_u64(dl_json_w *w, const char *key, uint64_t v);
void dl_json_w_str(dl_json_w *w, const char *key, const char *s);
void dl_json_w_bool(dl_json_w *w, const char *key, int v);
/* 1 true, 0 false, anything else null. */
void dl_json_w_tri(dl_json_w *w, const char *key, int v);
/* Before a value written by hand (dl_json_w_raw / dl_json_w_string): the
 * separator, the layout and the key. */
void dl_json_w_key(dl_json_w *w, const char *key);
/* Frees a buffer's text; safe twice. */
void dl_json_w_free(dl_json_w *w);

#endif
