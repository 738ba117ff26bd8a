/* libFuzzer target: the CURVE allowlist parser (proto/auth.c dl_auth_list_parse)
 * on text that is not NUL-terminated, checked against an independent line split. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/err.h"
#include "proto/auth.h"
#include "tests/fuzz/fuzz.h"

static int blank(char c) { return c == ' ' || c == '\t'; }

/* The allowlist format of proto/auth.h, read again the simple way: every line
 * that is not blank or a '#' comment is "<id> <key> ...". For an accepted list
 * each such line is an entry: the list must map its key to its id. Returns the
 * number of entry lines. */
static int check_entries(const char *text, size_t len, const dl_auth_list *l)
{
    int n = 0;
    for (const char *p = text, *end = text + len; p < end;) {
        const char *q = memchr(p, '\n', (size_t)(end - p));
        const char *next = q ? q + 1 : end;
        if (!q) q = end;
        if (q > p && q[-1] == '\r') q--;
        const char *s = p;
        p = next;
        while (s < q && blank(*s)) s++;
        if (s == q || *s == '#') continue;
        char id[DL_AUTH_ID_MAX + 1], key[DL_AUTH_Z85_LEN + 1];
        const char *a = s;
        while (s < q && !blank(*s)) s++;
        size_t idlen = (size_t)(s - a);
        FUZZ_CHECK(idlen >= 1 && idlen <= DL_AUTH_ID_MAX, "accepted an id of %zu bytes", idlen);
        memcpy(id, a, idlen);
        id[idlen] = 0;
        while (s < q && blank(*s)) s++;
        const char *k = s;
        while (s < q && !blank(*s)) s++;
        FUZZ_CHECK(s - k == DL_AUTH_Z85_LEN, "accepted a key of %zu bytes for '%s'", (size_t)(s - k), id);
        memcpy(key, k, DL_AUTH_Z85_LEN);
        key[DL_AUTH_Z85_LEN] = 0;
        FUZZ_CHECK(strlen(id) == idlen && dl_auth_id_ok(id), "accepted id '%s' fails dl_auth_id_ok", id);
        FUZZ_CHECK(dl_auth_z85_ok(key), "accepted key '%s' fails dl_auth_z85_ok", key);
        const char *owner = dl_auth_list_owner(l, key);
        FUZZ_CHECK(owner && strcmp(owner, id) == 0, "key '%s' of '%s' maps to '%s'", key, id, owner ? owner : "(none)");
        n++;
    }
    return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* exactly `size` bytes, no terminator: ASan catches a read past the end */
    char *text = malloc(size ? size : 1);
    FUZZ_CHECK(text, "malloc");
    memcpy(text, data, size);
    dl_auth_list *l = (dl_auth_list *)text; /* must be overwritten */
    dl_err_clear();
    /* the empty input as (NULL, 0), which the API allows (it once was
     * undefined behaviour: NULL + 0) */
    int rc = dl_auth_list_parse(size ? text : NULL, size, "fuzz.allow", &l);
    if (rc != 0) {
        FUZZ_CHECK(l == NULL, "failed parse left *out set");
        FUZZ_CHECK(rc == DL_EFORMAT, "parse returned %d (%s)", rc, dl_strerror(rc));
        FUZZ_CHECK(strncmp(dl_errmsg(), "fuzz.allow:", 11) == 0, "message '%s' does not name the list", dl_errmsg());
        FUZZ_VERDICT("refused: %s", dl_errmsg());
    } else {
        FUZZ_CHECK(l != NULL, "parse returned 0 without a list");
        int n = check_entries(text, size, l);
        FUZZ_CHECK(dl_auth_list_count(l) == n, "count %d, %d entry lines", dl_auth_list_count(l), n);
        FUZZ_CHECK(dl_auth_list_owner(l, "not a key") == NULL, "owner of a non-key");
        FUZZ_CHECK(dl_auth_list_owner(l, NULL) == NULL, "owner of NULL");
        FUZZ_VERDICT("accepted, %d entries", n);
    }
    dl_auth_list_free(&l);
    FUZZ_CHECK(l == NULL, "free leaves NULL");
    dl_auth_list_free(&l);
    free(text);
    return 0;
}
