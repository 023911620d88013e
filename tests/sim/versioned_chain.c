/*
 * versioned_chain.c: libversionedchain.so, a second LD_PRELOADed library that interposes dlsym itself and
 * forwards every lookup to the next dlsym it finds BY VERSION: dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34"),
 * as some real tools do (a versioned lookup is what picks glibc's current dlsym over its compatibility
 * ones). A versioned lookup skips any definition of "dlsym" that does not carry that symbol version, so a
 * hook whose dlsym is unversioned is bypassed, and the driver functions this library hands out are the
 * bare ones: allocations made through them go uncounted.
 *
 * Its own dlsym is unversioned (like most interposers'); it counts the lookups it forwarded and prints
 * "versionedchain lookups=N" at exit, so that a test can tell that the chain was really in the path.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

typedef void *(*dlsym_fn)(void *, const char *);

static dlsym_fn next_dlsym;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static atomic_ullong lookups;

/* glibc's symbol versions of dlsym: the current one, then the first one of each architecture. */
static void resolve(void) {
    static const char *const versions[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17"};
    for (size_t i = 0; i < sizeof versions / sizeof *versions && !next_dlsym; i++)
        next_dlsym = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", versions[i]);
    if (!next_dlsym) {
        fprintf(stderr, "versionedchain: no versioned dlsym after this library\n");
        abort();
    }
}

/* RTLD_NEXT is answered relative to the caller's return address, so a lookup made through this forwarding
 * function would be relative to this library: such lookups are refused here (no test makes them). */
__attribute__((visibility("default"))) void *dlsym(void *handle, const char *symbol) {
    if (handle == RTLD_NEXT) {
        fprintf(stderr, "versionedchain: RTLD_NEXT lookups are not forwarded\n");
        abort();
    }
    pthread_once(&once, resolve);
    atomic_fetch_add(&lookups, 1);
    return next_dlsym(handle, symbol);
}

__attribute__((destructor)) static void report(void) {
    fprintf(stderr, "versionedchain lookups=%llu\n", (unsigned long long)atomic_load(&lookups));
}
