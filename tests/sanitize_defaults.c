/* Linked into every executable of a sanitizer build (-DMESHTRAIN_SANITIZE=ON): the default options of
 * ASan/LSan/UBSan, so `ctest` in that build needs no environment. Variables in the environment
 * (ASAN_OPTIONS, LSAN_OPTIONS, UBSAN_OPTIONS) still override these.
 * - fast_unwind_on_malloc=0: Open MPI's libraries have no frame pointers, so the fast unwinder stops at
 *   the first of their frames and its allocations could not be matched to the suppressions.
 * - the LeakSanitizer suppressions are tests/lsan.supp, compiled in (Open MPI's own allocations only).
 * SPDX-License-Identifier: MIT */
extern const char mt_lsan_supp_text[];

const char *__asan_default_options(void);
const char *__lsan_default_suppressions(void);
const char *__lsan_default_options(void);
const char *__ubsan_default_options(void);

const char *__asan_default_options(void) {
    return "fast_unwind_on_malloc=0:detect_leaks=1";
}
const char *__lsan_default_suppressions(void) {
    return mt_lsan_supp_text;
}
const char *__lsan_default_options(void) {
    return "print_suppressions=0";
}
const char *__ubsan_default_options(void) {
    return "print_stacktrace=1";
}
