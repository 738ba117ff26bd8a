/* The assertion macros of the C tests. CHECK(cond, fmt, ...) counts a check,
 * and on failure counts it, prints file:line, the condition and the message,
 * and goes on, so one run reports every broken check; REQUIRE also exits when
 * the rest of the test cannot run. main() returns failures ? 1 : 0. */
#ifndef DL_TESTS_CHECK_H
#define DL_TESTS_CHECK_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
        checks++;                                                                                                 \
        if (!(cond)) {                                                                                            \
            failures++;                                                                                           \
            printf("FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);                                                \
            printf(__VA_ARGS__);                                                                                  \
            printf("\n%s: aborting after a fatal failure\n", __FILE__);                                          \
            exit(1);                                                                                              \
        }                                                                                                         \
    } while (0)

/* Typed comparisons that print both values. Each operand is evaluated once. */
#define CHECK_EQ(a, b)                                                                                            \
    do {                                                                                                          \
        long long check_a_ = (long long)(a), check_b_ = (long long)(b);                                           \
        CHECK(check_a_ == check_b_, "%s == %s: %lld != %lld", #a, #b, check_a_, check_b_);                        \
    } while (0)

/* |a - b| <= tol, as doubles; a NaN on either side fails. */
#define CHECK_NEAR(a, b, tol)                                                                                     \
    do {                                                                                                          \
        double check_a_ = (double)(a), check_b_ = (double)(b), check_t_ = (double)(tol);                          \
        double check_d_ = check_a_ > check_b_ ? check_a_ - check_b_ : check_b_ - check_a_;                        \
        CHECK(check_d_ <= check_t_, "%s ~= %s: %.17g vs %.17g (tol %.3g)", #a, #b, check_a_, check_b_, check_t_); \
    } while (0)

/* Two C strings equal (NULL only equals NULL). */
#define CHECK_STR(a, b)                                                                                           \
    do {                                                                                                          \
        const char *check_a_ = (a), *check_b_ = (b);                                                              \
        int check_eq_ = check_a_ && check_b_ ? strcmp(check_a_, check_b_) == 0 : check_a_ == check_b_;            \
        CHECK(check_eq_, "%s == %s: \"%s\" != \"%s\"", #a, #b, check_a_ ? check_a_ : "(null)",                    \
              check_b_ ? check_b_ : "(null)");                                                                    \
    } while (0)

/* The last line of main(): prints the tally and gives the exit status. */
#define CHECK_DONE(name)                                                                                          \
    (printf("%s: %d checks, %d failed%s\n", (name), checks, failures, failures ? " -- FAILED" : ""),             \
     failures ? 1 : 0)

#endif
