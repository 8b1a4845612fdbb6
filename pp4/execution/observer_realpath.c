/* pp4-observe's preload: realpath(3) with this process's readlink answers remembered.

   Why: glibc's realpath reads every folder of a name with readlink, and cc1plus canonicalizes each
   system header's name with it, so one torch-including unit asks about the same few thousand
   folders about 100,000 times: 80% of all the calls pp4-observe handles, each a round trip to the
   supervisor. Here each distinct folder is asked once per process; the observer still sees that
   first readlink (a system call like any other), so what a compile observed is the same set of
   paths with the same answers, in a quarter of the round trips.

   The function is glibc's (2.35 and later, stdlib/canonicalize.c) rewritten around one change:
   readlink goes through remember(). tests/test_observe.py compares it with the C library's own
   realpath on links absolute and relative, chains, loops, dangling links, "." and "..", missing
   and non-folder components, trailing slashes and relative names. With an older glibc, or when a
   process changes links itself (it calls symlink, rename, unlink ... through the C library), the
   remembered answers are dropped or not used.

   Loaded by pp4-observe through LD_PRELOAD into every dynamically linked program it runs; a static
   program calls its own realpath and is observed call by call as before. */

#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <gnu/libc-version.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define ELOOP_THRESHOLD 40 /* glibc's __eloop_threshold() on Linux: _SC_SYMLOOP_MAX is unset there */

/* One remembered readlink: n >= 0 and the target, or n == -1 and the errno. */
struct answer {
    char *path;
    ssize_t n;
    int error;
    char *target;
};

static struct answer *table;
static size_t slots, used;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int usable = -1; /* -1: not decided; 0: forward to the C library's realpath; 1: here */

static void take(void) { pthread_mutex_lock(&lock); }
static void give(void) { pthread_mutex_unlock(&lock); }

__attribute__((constructor)) static void setup(void) {
    int major = 0, minor = 0;
    sscanf(gnu_get_libc_version(), "%d.%d", &major, &minor);
    usable = major > 2 || (major == 2 && minor >= 35);
    /* A fork while another thread holds the lock must not leave the child's copy held. */
    pthread_atfork(take, give, give);
}

static size_t hash(const char *s) {
    size_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static void forget(void) {
    take();
    for (size_t i = 0; i < slots; i++) {
        free(table[i].path);
        free(table[i].target);
    }
    free(table);
    table = NULL;
    slots = used = 0;
    give();
}

static struct answer *slot_of(const char *path) {
    size_t i = hash(path) & (slots - 1);
    while (table[i].path && strcmp(table[i].path, path)) i = (i + 1) & (slots - 1);
    return &table[i];
}

static int grow(void) {
    size_t old = slots;
    struct answer *was = table;
    slots = old ? 2 * old : 4096;
    table = calloc(slots, sizeof *table);
    if (!table) { table = was; slots = old; return -1; }
    used = 0;
    for (size_t i = 0; i < old; i++)
        if (was[i].path) { *slot_of(was[i].path) = was[i]; used++; }
    free(was);
    return 0;
}

/* readlink(path), answered from memory after the first time. Returns n as readlink would (the
   target copied into buf, not terminated), with errno set when -1. */
static ssize_t remember(const char *path, char *buf, size_t size) {
    take();
    if (slots && slot_of(path)->path) {
        struct answer *a = slot_of(path);
        ssize_t n = a->n;
        int error = a->error;
        if (n >= 0) memcpy(buf, a->target, (size_t)n < size ? (size_t)n : size);
        give();
        if (n < 0) errno = error;
        return n >= 0 && (size_t)n > size ? (ssize_t)size : n;
    }
    give();
    char target[PATH_MAX];
    ssize_t n = readlink(path, target, sizeof target);
    int error = errno;
    if (n >= 0 && (size_t)n == sizeof target) { /* cannot be told from a cut one: do not keep it */
        ssize_t m = readlink(path, buf, size);
        return m;
    }
    take();
    if (used * 2 >= slots && grow()) { give(); goto answer; }
    struct answer *a = slot_of(path);
    if (!a->path) {
        char *p = strdup(path), *t = n >= 0 ? malloc((size_t)n + 1) : NULL;
        if (p && (n < 0 || t)) {
            if (t) memcpy(t, target, (size_t)n), t[n] = 0;
            *a = (struct answer){p, n, error, t};
            used++;
        } else {
            free(p);
            free(t);
        }
    }
    give();
answer:
    if (n < 0) { errno = error; return n; }
    memcpy(buf, target, (size_t)n < size ? (size_t)n : size);
    return (size_t)n < size ? n : (ssize_t)size;
}

/* A growable string. */
struct text { char *s; size_t len, cap; };

static int reserve(struct text *t, size_t more) {
    if (t->len + more + 1 <= t->cap) return 0;
    size_t cap = t->cap ? t->cap : 256;
    while (cap < t->len + more + 1) cap *= 2;
    char *s = realloc(t->s, cap);
    if (!s) return -1;
    t->s = s;
    t->cap = cap;
    return 0;
}

/* True when what follows a component makes it a folder that must be shown to be one: a trailing
   "/", or "/." or "/.." after it (glibc's suffix_requires_dir_check). */
static int needs_folder(const char *end) {
    while (*end == '/') {
        do end++; while (*end == '/');
        char c = *end++;
        if (c == 0) return 1;
        if (c != '.') return 0;
        if (!*end || (*end == '.' && (!end[1] || end[1] == '/'))) return 1;
    }
    return 0;
}

static void up(struct text *r) { /* back to the previous component; the root stays */
    if (r->len > 1) {
        r->len--;
        while (r->len > 0 && r->s[r->len - 1] != '/') r->len--;
    }
}

static char *resolve(const char *name, char *resolved) {
    if (!name) { errno = EINVAL; return NULL; }
    if (!name[0]) { errno = ENOENT; return NULL; }
    struct text r = {0}, extra = {0};
    int failed = 1, links = 0;
    char link[PATH_MAX];
    if (name[0] != '/') {
        size_t cap = 256;
        for (;;) {
            if (reserve(&r, cap)) goto nomem;
            if (getcwd(r.s, r.cap)) break;
            if (errno != ERANGE) { r.len = 0; goto done; }
            cap = r.cap * 2;
        }
        r.len = strlen(r.s);
    } else {
        if (reserve(&r, 1)) goto nomem;
        r.s[r.len++] = '/';
    }
    const char *start = name, *end;
    for (; *start; start = end) {
        while (*start == '/') start++;
        for (end = start; *end && *end != '/'; end++) {}
        size_t n = (size_t)(end - start);
        if (n == 0) break;
        if (n == 1 && start[0] == '.') continue;
        if (n == 2 && start[0] == '.' && start[1] == '.') { up(&r); continue; }
        if (reserve(&r, n + 2)) goto nomem;
        if (r.s[r.len - 1] != '/') r.s[r.len++] = '/';
        memcpy(r.s + r.len, start, n);
        r.len += n;
        r.s[r.len] = 0;
        ssize_t got = remember(r.s, link, sizeof link);
        if (got >= 0) {
            if (++links > ELOOP_THRESHOLD) { errno = ELOOP; goto done; }
            /* The rest of the name is now the link's target followed by what came after. */
            size_t rest = strlen(end);
            struct text next = {0};
            if (reserve(&next, (size_t)got + rest)) goto nomem;
            memcpy(next.s, link, (size_t)got);
            memcpy(next.s + got, end, rest + 1);
            free(extra.s);
            extra = next;
            end = extra.s;
            if (link[0] == '/') r.len = 1;
            else up(&r);
        } else if (needs_folder(end)) {
            if (reserve(&r, 1)) goto nomem;
            r.s[r.len] = '/';
            r.s[r.len + 1] = 0;
            if (faccessat(AT_FDCWD, r.s, F_OK, AT_EACCESS)) goto done;
        } else if (errno != EINVAL) {
            goto done;
        }
    }
    if (r.len > 1 && r.s[r.len - 1] == '/') r.len--;
    failed = 0;
done:
    if (reserve(&r, 0)) goto nomem;
    r.s[r.len] = 0;
    free(extra.s);
    if (resolved) {
        /* A failure leaves its partial name only where the name does not exist or cannot be
           searched, as glibc does (since 2.35) */
        if ((!failed || errno == ENOENT || errno == EACCES) && r.len + 1 <= PATH_MAX) strcpy(resolved, r.s);
        else if (!failed) { failed = 1; errno = ENAMETOOLONG; }
        int keep = errno;
        free(r.s);
        errno = keep;
        return failed ? NULL : resolved;
    }
    if (failed) { int keep = errno; free(r.s); errno = keep; return NULL; }
    return r.s;
nomem:
    free(r.s);
    free(extra.s);
    errno = ENOMEM;
    return NULL;
}

static char *(*library_realpath(void))(const char *, char *) {
    static char *(*real)(const char *, char *);
    if (!real) real = (char *(*)(const char *, char *))dlsym(RTLD_NEXT, "realpath");
    return real;
}

char *realpath(const char *name, char *resolved) {
    if (usable != 1) return library_realpath()(name, resolved);
    return resolve(name, resolved);
}

char *canonicalize_file_name(const char *name) { return realpath(name, NULL); }

char *__realpath_chk(const char *name, char *resolved, size_t resolvedlen) {
    if (resolvedlen < PATH_MAX) abort(); /* glibc's __chk_fail: a buffer too small for any answer */
    return realpath(name, resolved);
}

/* This process changing links or folders itself: what it remembered may no longer hold. */
#define FORGETS(ret, fn, params, args)                                 \
    ret fn params {                                                    \
        static ret (*real) params;                                     \
        if (!real) real = (ret (*) params)dlsym(RTLD_NEXT, #fn);       \
        forget();                                                      \
        return real args;                                              \
    }

FORGETS(int, symlink, (const char *a, const char *b), (a, b))
FORGETS(int, symlinkat, (const char *a, int d, const char *b), (a, d, b))
FORGETS(int, rename, (const char *a, const char *b), (a, b))
FORGETS(int, renameat, (int d, const char *a, int e, const char *b), (d, a, e, b))
FORGETS(int, renameat2, (int d, const char *a, int e, const char *b, unsigned f), (d, a, e, b, f))
FORGETS(int, unlink, (const char *a), (a))
FORGETS(int, unlinkat, (int d, const char *a, int f), (d, a, f))
FORGETS(int, rmdir, (const char *a), (a))
FORGETS(int, mkdir, (const char *a, mode_t m), (a, m))
FORGETS(int, mkdirat, (int d, const char *a, mode_t m), (d, a, m))
FORGETS(int, link, (const char *a, const char *b), (a, b))
FORGETS(int, linkat, (int d, const char *a, int e, const char *b, int f), (d, a, e, b, f))
