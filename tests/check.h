/* The one assertion macro of the C tests: CHECK(cond, fmt, ...) counts a
 * failure and prints file:line and the message, and the test goes on, so one
 * run reports every broken check; main() returns failures ? 1 : 0. */
#ifndef DL_TESTS_CHECK_H
#define DL_TESTS_CHECK_H

#include <stdio.h>

static int failures;
#define CHECK(cond, ...)                                                                                          \
    do {                                                                                                          \
        if (!(cond)) {                                                                                            \
            failures++;                                                                                           \
            printf("FAIL %s:%d: ", __FILE__, __LINE__);                                                           \
            printf(__VA_ARGS__);                                                                                  \
            printf("\n");                                                                                         \
        }                                                                                                         \
    } while (0)

#endif
