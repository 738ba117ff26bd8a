/* core/prom: label escaping, HELP/TYPE lines, value formatting, histogram
 * buckets cumulative with +Inf, _sum and _count, JSON strings (core/json's
 * escaper) that always parse. */
#include "core/prom.h"

#include <math.h>

#include "core/err.h"
#include "core/json.h"

#include "tests/check.h"

static int has(const dl_prom *p, const char *line) { return strstr(p->buf, line) != NULL; }

int main(void)
{
    char lb[64] = "";
    CHECK_EQ(dl_prom_label(lb, sizeof lb, "id", "a\"b\\c\nd"), 0);
    CHECK(!strcmp(lb, "id=\"a\\\"b\\\\c\\nd\""), "escaped: %s", lb);
    CHECK_EQ(dl_prom_label(lb, sizeof lb, "kind", "push"), 0);
    CHECK(!strcmp(lb, "id=\"a\\\"b\\\\c\\nd\",kind=\"push\""), "two labels: %s", lb);
    char small[12] = "";
    CHECK(dl_prom_label(small, sizeof small, "id", "0123456789") < 0, "too long refused");
    CHECK(small[0] == 0, "unchanged on refusal: '%s'", small);

    /* out of memory: the buffer says so and takes nothing more, never aborts */
    dl_prom f;
    dl_alloc_fail_after(1);
    dl_prom_init(&f);
    dl_alloc_fail_after(0);
    CHECK(f.failed && !f.buf, "a failed init is marked");
    dl_prom_sample(&f, "dloco_x", NULL, 1);
    CHECK(f.failed && f.len == 0, "and appends nothing");
    dl_prom_free(&f);
    dl_prom_init(&f);
    dl_alloc_fail_after(1);
    for (int i = 0; i < 1000 && !f.failed; i++) dl_prom_sample(&f, "dloco_a_rather_long_metric_name", NULL, i);
    dl_alloc_fail_after(0);
    CHECK(f.failed && f.len < f.cap && f.buf[f.len] == 0, "a failed growth keeps the text so far, terminated");
    dl_prom_free(&f);

    dl_prom p;
    dl_prom_init(&p);
    dl_prom_family(&p, "dloco_x_total", "counter", "a help\nwith \\ and newline");
    CHECK(has(&p, "# HELP dloco_x_total a help\\nwith \\\\ and newline\n# TYPE dloco_x_total counter\n"), "%s", p.buf);
    dl_prom_sample(&p, "dloco_x_total", NULL, 42);
    dl_prom_sample(&p, "dloco_y", "a=\"1\"", 0.1);
    dl_prom_sample(&p, "dloco_z", "", INFINITY);
    dl_prom_sample(&p, "dloco_n", NULL, NAN);
    dl_prom_sample(&p, "dloco_big", NULL, 18446744073709551615.0);
    CHECK(has(&p, "\ndloco_x_total 42\n"), "integer");
    CHECK(has(&p, "\ndloco_y{a=\"1\"} 0.1\n"), "shortest float");
    CHECK(has(&p, "\ndloco_z +Inf\n"), "+Inf");
    CHECK(has(&p, "\ndloco_n NaN\n"), "NaN");
    CHECK(has(&p, "\ndloco_big 1.8446744073709552e+19\n"), "big: %s", p.buf);

    static const double le[] = {0.5, 1, 2.5};
    dl_prom_hist h;
    dl_prom_hist_init(&h, le, 3);
    double obs[] = {0.1, 0.5, 0.7, 1, 3, 100, NAN};
    for (size_t i = 0; i < sizeof obs / sizeof obs[0]; i++) dl_prom_hist_observe(&h, obs[i]);
    CHECK_EQ(h.count, 7);
    dl_prom_histogram(&p, "dloco_h_seconds", "f=\"2\"", &h);
    CHECK(has(&p, "dloco_h_seconds_bucket{f=\"2\",le=\"0.5\"} 2\n"), "<= 0.5 inclusive");
    CHECK(has(&p, "dloco_h_seconds_bucket{f=\"2\",le=\"1\"} 4\n"), "cumulative");
    CHECK(has(&p, "dloco_h_seconds_bucket{f=\"2\",le=\"2.5\"} 4\n"), "empty bucket keeps the sum");
    CHECK(has(&p, "dloco_h_seconds_bucket{f=\"2\",le=\"+Inf\"} 7\n"), "+Inf = count");
    CHECK(has(&p, "dloco_h_seconds_sum{f=\"2\"} 105.3\n"), "sum skips NaN: %s", p.buf);
    CHECK(has(&p, "dloco_h_seconds_count{f=\"2\"} 7\n"), "count");
    dl_prom_hist h0;
    dl_prom_hist_init(&h0, le, 3);
    dl_prom_histogram(&p, "dloco_e", NULL, &h0);
    CHECK(has(&p, "dloco_e_bucket{le=\"+Inf\"} 0\ndloco_e_sum 0\ndloco_e_count 0\n"), "empty, no labels");

    /* growth past the first allocation keeps every byte */
    size_t before = p.len;
    for (int i = 0; i < 2000; i++) dl_prom_raw(&p, "%04d\n", i);
    CHECK_EQ(p.len, before + 2000 * 5);
    CHECK(!strcmp(p.buf + p.len - 5, "1999\n"), "tail");
    dl_prom_free(&p);
    /* a learner id as /status.json writes it: quotes, a backslash, a newline,
     * a control byte and a byte that is not UTF-8 still give JSON that parses */
    dl_prom_init(&p);
    dl_prom_json_str(&p, "q\"b\\n\nt\x01\xff");
    CHECK(!strcmp(p.buf, "\"q\\\"b\\\\n\\nt\\u0001\\ufffd\""), "escaped as core/json does: %s", p.buf);
    dl_json *j = NULL;
    CHECK(dl_json_parse(p.buf, p.len, &j) == 0 && j && !strcmp(j->str, "q\"b\\n\nt\x01\xef\xbf\xbd"),
          "it parses back");
    dl_json_free(&j);
    dl_prom_free(&p);
    printf("test_prom: %d checks, %d failures\n", checks, failures);
    return failures ? 1 : 0;
}
