/* The assertion macros of the C tests. CHECK(cond, fmt, ...) counts a check,
 * and on failure counts it, prints file:line, the condition and the message,
 * and goes on, so one run reports every broken check; REQUIRE also exits when
 * the rest of the test cannot run. main() returns failures ? 1 : 0. */
#ifndef DL_TESTS_CHECK_H
#define DL_TESTS_CHECK_H

#include <stdio.h>
#include <stdlib.h>

static int checks, failures;
#define CHECK(cond, ...)                                                                                          \
    do {                                                                                                          \
        checks++;                                                                                                 \
        if (!(cond)) {                                                                                            \
            failures++;                                                                                           \
            printf("FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);                                                \
            printf(__VA_ARGS__);                                                                                  \
            printf("\n");                                                                                         \
        }                                                                                                         \
    } while (0)

#define REQUIRE(cond, ...)                                                                                        \
    do {                                                                                                          \
        int require_ok_ = !!(cond);                                                                               \
        CHECK(require_ok_, __VA_ARGS__);                                                                          \
        if (!require_ok_) {                                                                                       \
            printf("%s: aborting after a fatal failure\n", __FILE__);                                             \
            exit(1);                                                                                              \
        }                                                                                                         \
    } while (0)

#endif
