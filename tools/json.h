/* A minimal JSON reader for the operator command: one document parsed into
 * a tree of nodes (objects, arrays, strings, numbers, true/false/null), for
 * documents we produce ourselves (/status.json). Bounded depth and size. */
#ifndef DL_TOOLS_JSON_H
#define DL_TOOLS_JSON_H

#include <stddef.h>

typedef enum { DL_JSON_NULL, DL_JSON_BOOL, DL_JSON_NUM, DL_JSON_STR, DL_JSON_ARR, DL_JSON_OBJ } dl_json_type;

typedef struct dl_json {
    dl_json_type type;
    double num;            /* NUM; BOOL: 0 or 1 */
    char *str;             /* STR: decoded (\uXXXX below 0x80 only; others become '?') */
    char *key;             /* member name when inside an object */
    struct dl_json *child; /* ARR / OBJ: first element */
    struct dl_json *next;  /* next sibling */
} dl_json;

/* Parse text[0, len). DL_EFORMAT with the byte offset on malformed input
 * (depth > 32 included). *out is freed with dl_json_free. */
int dl_json_parse(const char *text, size_t len, dl_json **out);
void dl_json_free(dl_json **j);
/* Member `key` of an object, NULL when absent or j is not an object. */
const dl_json *dl_json_get(const dl_json *j, const char *key);
/* Convenience: number / string of member key, or def when absent or of
 * another type. */
double dl_json_num(const dl_json *j, const char *key, double def);
const char *dl_json_str(const dl_json *j, const char *key, const char *def);

#endif
