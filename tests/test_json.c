/* core/json: the tree `dloco status` reads /status.json with: values,
 * escapes, lookups, and refusals of malformed input (every truncation of a
 * valid document, too deep, trailing bytes, what the strict cursor refuses)
 * without leaks or overreads; the writer's output parses back. */
#include "core/json.h"

#include <math.h>

#include "core/err.h"
#include "tests/check.h"

int main(void)
{
    const char *doc = "{\"schema\":1,\"s\":\"a\\\"b\\\\c\\n\\u0041\",\"neg\":-2.5e3,\"t\":true,\"f\":false,\"n\":null,"
                      "\"arr\":[{\"id\":\"x\",\"v\":1},{\"id\":\"y\",\"v\":2}],\"empty\":[],\"o\":{}}";
    dl_json *j = NULL;
    REQUIRE(dl_json_parse(doc, strlen(doc), &j) == 0, "parse: %s", dl_errmsg());
    CHECK_EQ(dl_json_num(j, "schema", -1), 1);
    CHECK(!strcmp(dl_json_str(j, "s", ""), "a\"b\\c\nA"), "escapes: %s", dl_json_str(j, "s", ""));
    CHECK_NEAR(dl_json_num(j, "neg", 0), -2500, 0);
    CHECK_EQ(dl_json_num(j, "t", -1), 1);
    CHECK_EQ(dl_json_num(j, "f", -1), 0);
    CHECK(dl_json_get(j, "n")->type == DL_JSON_NULL, "null");
    CHECK_EQ(dl_json_num(j, "n", 7), 7);
    CHECK(dl_json_get(j, "missing") == NULL, "absent");
    CHECK(!strcmp(dl_json_str(j, "schema", "def"), "def"), "a number is not a string");
    const dl_json *arr = dl_json_get(j, "arr");
    int n = 0;
    double sum = 0;
    for (const dl_json *e = arr->child; e; e = e->next) n++, sum += dl_json_num(e, "v", 0);
    CHECK_EQ(n, 2);
    CHECK_EQ(sum, 3);
    CHECK(dl_json_get(j, "empty")->child == NULL && dl_json_get(j, "o")->type == DL_JSON_OBJ, "empty containers");
    dl_json_free(&j);
    dl_json_free(&j);
    /* every proper prefix of the document is refused */
    size_t len = strlen(doc);
    int refused = 0;
    for (size_t k = 0; k < len; k++) {
        dl_json *p = NULL;
        refused += dl_json_parse(doc, k, &p) == DL_EFORMAT && p == NULL;
    }
    CHECK_EQ(refused, (long long)len);
    const char *bad[] = {"{\"a\":1,}", "{\"a\" 1}", "[1 2]", "{\"a\":1} x", "tru", "\"open", "{1:2}", "-", ""};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        dl_json *p = NULL;
        CHECK(dl_json_parse(bad[k], strlen(bad[k]), &p) == DL_EFORMAT, "refused: %s", bad[k]);
    }
    char deep[200];
    memset(deep, '[', 100);
    memset(deep + 100, ']', 100);
    dl_json *p = NULL;
    CHECK(dl_json_parse(deep, sizeof deep, &p) == DL_EFORMAT, "100 levels refused");
    CHECK(dl_json_parse(deep + 80, 40, &p) == 0, "20 levels fine");
    dl_json_free(&p);
    /* the cursor is strict: control bytes, bad escapes, NUL, non-JSON numbers */
    const char *strict[] = {"\"a\x01\"", "\"\\x\"", "\"\\u0000\"", "[1.]", "[+1]", "[.5]", "{\"a\":1} 2"};
    for (size_t k = 0; k < sizeof strict / sizeof strict[0]; k++) {
        dl_json *q = NULL;
        CHECK(dl_json_parse(strict[k], strlen(strict[k]), &q) == DL_EFORMAT && !q, "strict: %s", strict[k]);
    }
    REQUIRE(dl_json_parse("\"\\u00e9\"", 8, &p) == 0, "\\u00e9: %s", dl_errmsg());
    CHECK(!strcmp(p->str, "\xc3\xa9"), "\\u00e9 is UTF-8");
    dl_json_free(&p);
    /* the writer, to a buffer: escapes, NaN as null, layout; it parses back */
    dl_json_w w = {0};
    dl_json_w_open(&w, NULL, '{', 0);
    dl_json_w_str(&w, "s", "q\"b\\n\nt\t\x01\xff");
    dl_json_w_num(&w, "nan", NAN);
    dl_json_w_u64(&w, "big", 18446744073709551615ull);
    dl_json_w_open(&w, "a", '[', 1);
    dl_json_w_int(&w, NULL, -3);
    dl_json_w_bool(&w, NULL, 1);
    dl_json_w_tri(&w, NULL, 2);
    dl_json_w_close(&w, ']');
    dl_json_w_close(&w, '}');
    CHECK(!strcmp(w.buf, "{\n  \"s\": \"q\\\"b\\\\n\\nt\\t\\u0001\\ufffd\",\n  \"nan\": null,\n"
                         "  \"big\": 18446744073709551615,\n  \"a\": [-3, true, null]\n}"),
          "writer layout: %s", w.buf);
    REQUIRE(dl_json_parse(w.buf, w.len, &p) == 0, "writer output parses: %s", dl_errmsg());
    CHECK(!strcmp(dl_json_str(p, "s", ""), "q\"b\\n\nt\t\x01\xef\xbf\xbd"), "string round trip");
    CHECK(dl_json_get(p, "nan")->type == DL_JSON_NULL, "NaN written as null");
    dl_json_free(&p);
    dl_json_w_free(&w);
    dl_json_w_free(&w);
    printf("test_json: %d checks, %d failures\n", checks, failures);
    return failures ? 1 : 0;
}
