/* pp4-observe: every path a command and all its children asked the kernel about, and what was there.

       pp4-observe [--preload LIB] LOG COMMAND [ARG...]

   Built by pp4 with the host C compiler (pp4/execution/observe.py). A seccomp filter, inherited
   by every process the command starts (static programs included, since it acts on system calls,
   not library calls), hands each call below to this supervisor as a user notification: the
   calling thread waits while its path arguments are read from its memory and what is at the
   path is looked up (stat, or lstat where the call does not follow a final link), then the call
   goes on as the process made it. One line per call goes to LOG:

       PID <tab> CALL <tab> ERRNO <tab> FLAGS <tab> PATH [<tab> PATH2]

   A call whose name, flags and path were logged before with something there is not logged again
   (nor looked at: the log's reader keeps a path's first such answer), nor is the stat of an open
   file (an empty path: the open was logged).

   ERRNO is what the lookup found at the moment of the call (0: something is there). FLAGS: 'w'
   opened for writing, 'n' a final link not followed, 'e' an empty path (the call names an open
   file), '?' a path that could not be read or resolved, 's' a socket address that is no path
   (connect and bind log a Unix socket's path, else "family N"). Paths are absolute as the process named
   them (relative ones joined to its working folder or dirfd, nothing normalized); tab, newline
   and backslash are written as \t, \n and \\. The exit status is the command's (128 + signal).

   Why this and not strace or a ptrace tracer: a notification costs one round trip to this process
   per call, where ptrace stops the caller twice (entry and exit) and strace also decodes and prints
   every argument. On a g++ unit of torch's headers (24,600 calls, 84% of them glibc realpath's
   readlink) that is about a third of strace's added CPU (bench/observe_overhead.py). It needs
   Linux 5.8 (notifications that let the call go on, and a hang-up when the last process is gone)
   and no ptrace permission. Where the kernel offers it (6.6), the supervisor and the caller trade
   the processor they are on instead of waking each other on two.

   --preload LIB goes into the command's LD_PRELOAD: observer_realpath.c, which makes each process
   ask the kernel about a folder once where glibc's realpath asks again for every name under it.
   The loader's opening of LIB is not logged: it is pp4's, not the command's. */

#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/openat2.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#if defined(__x86_64__)
#define ARCH AUDIT_ARCH_X86_64
#elif defined(__aarch64__)
#define ARCH AUDIT_ARCH_AARCH64
#else
#error "pp4-trace knows the system calls of x86_64 and aarch64 only"
#endif

enum kind { READ, NOFOLLOW, WRITE, LIST, EXEC, CHDIR, SOCKET, MACHINE, CHANNEL };

/* A traced call: where its paths are. dirfd: the argument holding the folder the path at `path`
   is relative to (-1: the working folder). flags: the argument whose bits say write/nofollow/empty
   (-1: none). path2/dirfd2: a second path (rename, link). */
struct call {
    long nr;
    const char *name;
    enum kind kind;
    int dirfd, path, flags, dirfd2, path2;
};

#define C(n, k, d, p, f, d2, p2) {SYS_##n, #n, k, d, p, f, d2, p2}
static const struct call CALLS[] = {
#ifdef SYS_open
    C(open, READ, -1, 0, 1, -1, -1),
    C(stat, READ, -1, 0, -1, -1, -1),
    C(lstat, NOFOLLOW, -1, 0, -1, -1, -1),
    C(access, READ, -1, 0, -1, -1, -1),
    C(readlink, NOFOLLOW, -1, 0, -1, -1, -1),
    C(creat, WRITE, -1, 0, -1, -1, -1),
    C(unlink, WRITE, -1, 0, -1, -1, -1),
    C(rmdir, WRITE, -1, 0, -1, -1, -1),
    C(mkdir, WRITE, -1, 0, -1, -1, -1),
    C(rename, WRITE, -1, 0, -1, -1, 1),
    C(link, WRITE, -1, 0, -1, -1, 1),
    C(symlink, WRITE, -1, 1, -1, -1, -1),
    C(chmod, WRITE, -1, 0, -1, -1, -1),
    C(chown, WRITE, -1, 0, -1, -1, -1),
    C(lchown, WRITE, -1, 0, -1, -1, -1),
    C(utime, WRITE, -1, 0, -1, -1, -1),
    C(utimes, WRITE, -1, 0, -1, -1, -1),
    C(futimesat, WRITE, 0, 1, -1, -1, -1),
    C(mknod, WRITE, -1, 0, -1, -1, -1),
    C(getdents, LIST, -1, -1, -1, -1, -1),
#endif
    C(openat, READ, 0, 1, 2, -1, -1),
    C(openat2, READ, 0, 1, 2, -1, -1),
    C(newfstatat, READ, 0, 1, 3, -1, -1),
    C(statx, READ, 0, 1, 2, -1, -1),
    C(faccessat, READ, 0, 1, -1, -1, -1),
#ifdef SYS_faccessat2
    C(faccessat2, READ, 0, 1, 3, -1, -1),
#endif
    C(readlinkat, NOFOLLOW, 0, 1, -1, -1, -1),
    C(execve, EXEC, -1, 0, -1, -1, -1),
    C(execveat, EXEC, 0, 1, 4, -1, -1),
    C(statfs, READ, -1, 0, -1, -1, -1),
    C(getxattr, READ, -1, 0, -1, -1, -1),
    C(lgetxattr, NOFOLLOW, -1, 0, -1, -1, -1),
    C(listxattr, READ, -1, 0, -1, -1, -1),
    C(llistxattr, NOFOLLOW, -1, 0, -1, -1, -1),
    C(setxattr, WRITE, -1, 0, -1, -1, -1),
    C(lsetxattr, WRITE, -1, 0, -1, -1, -1),
    C(removexattr, WRITE, -1, 0, -1, -1, -1),
    C(lremovexattr, WRITE, -1, 0, -1, -1, -1),
    C(unlinkat, WRITE, 0, 1, -1, -1, -1),
    C(mkdirat, WRITE, 0, 1, -1, -1, -1),
    C(mknodat, WRITE, 0, 1, -1, -1, -1),
    C(renameat, WRITE, 0, 1, -1, 2, 3),
    C(renameat2, WRITE, 0, 1, -1, 2, 3),
    C(linkat, WRITE, 0, 1, -1, 2, 3),
    C(symlinkat, WRITE, 1, 2, -1, -1, -1),
    C(fchmodat, WRITE, 0, 1, -1, -1, -1),
    C(fchownat, WRITE, 0, 1, -1, -1, -1),
    C(truncate, WRITE, -1, 0, -1, -1, -1),
    C(utimensat, WRITE, 0, 1, -1, -1, -1),
    C(chdir, CHDIR, -1, 0, -1, -1, -1),
    C(fchdir, CHDIR, -1, -1, -1, -1, -1),
    C(chroot, CHDIR, -1, 0, -1, -1, -1),
    C(getdents64, LIST, -1, -1, -1, -1, -1),
    /* Calls that take a path pp4 cannot judge: seen, and reported as opaque. */
    C(mount, WRITE, -1, 1, -1, -1, -1),
    C(umount2, WRITE, -1, 0, -1, -1, -1),
    C(pivot_root, WRITE, -1, 0, -1, -1, 1),
    /* The mount API without mount(2) (a copy of a tree attached over a folder), and entering another
       process's namespaces: after either, a path may name other bytes than it names here. */
#ifdef SYS_open_tree
    C(open_tree, WRITE, 0, 1, -1, -1, -1),
    C(move_mount, WRITE, 0, 1, -1, 2, 3),
    C(fsopen, WRITE, -1, -1, -1, -1, -1),
    C(fsmount, WRITE, -1, -1, -1, -1, -1),
    C(fspick, WRITE, 0, 1, -1, -1, -1),
#endif
#ifdef SYS_mount_setattr
    C(mount_setattr, WRITE, 0, 1, -1, -1, -1),
#endif
    C(setns, WRITE, -1, -1, -1, -1, -1),
    C(name_to_handle_at, READ, 0, 1, -1, -1, -1),
    C(open_by_handle_at, WRITE, -1, -1, -1, -1, -1),
    C(inotify_add_watch, READ, -1, 1, -1, -1, -1),
    C(fanotify_mark, READ, 3, 4, -1, -1, -1),
    /* A socket reaches another process (a compiler cache's server, a remote compiler, a network
       service): what it answers is an input no path shows. The address is logged: a Unix socket's
       path (nothing there: the connect fails, an absence like any other), or its family. */
    C(connect, SOCKET, -1, -1, -1, -1, -1),
    C(bind, SOCKET, -1, -1, -1, -1, -1),
    /* The machine's name and kernel release (gethostname asks this too): no path shows them. */
    C(uname, MACHINE, -1, -1, -1, -1, -1),
    /* Other ways to another process, or to what another process left, that no file's content shows:
       System V shared memory, message queues and semaphores, POSIX message queues, another
       process's memory or descriptors, an open file's extended attributes (getxattr and the like,
       above, log their path), the kernel's key store. The call itself is what is logged. */
    C(shmget, CHANNEL, -1, -1, -1, -1, -1),
    C(shmat, CHANNEL, -1, -1, -1, -1, -1),
    C(shmctl, CHANNEL, -1, -1, -1, -1, -1),
    C(msgget, CHANNEL, -1, -1, -1, -1, -1),
    C(msgrcv, CHANNEL, -1, -1, -1, -1, -1),
    C(msgctl, CHANNEL, -1, -1, -1, -1, -1),
    C(semget, CHANNEL, -1, -1, -1, -1, -1),
    C(semctl, CHANNEL, -1, -1, -1, -1, -1),
    C(semop, CHANNEL, -1, -1, -1, -1, -1),
    C(semtimedop, CHANNEL, -1, -1, -1, -1, -1),
    C(mq_open, CHANNEL, -1, -1, -1, -1, -1),
    C(process_vm_readv, CHANNEL, -1, -1, -1, -1, -1),
    C(ptrace, CHANNEL, -1, -1, -1, -1, -1),
#ifdef SYS_pidfd_getfd
    C(pidfd_getfd, CHANNEL, -1, -1, -1, -1, -1),
#endif
    C(fgetxattr, CHANNEL, -1, -1, -1, -1, -1),
    C(flistxattr, CHANNEL, -1, -1, -1, -1, -1),
    C(keyctl, CHANNEL, -1, -1, -1, -1, -1),
    C(request_key, CHANNEL, -1, -1, -1, -1, -1),
#ifdef SYS_io_uring_setup
    /* A ring's requests (IORING_OP_OPENAT, _STATX, ...) are carried out without a call this filter
       sees: a process that sets one up is reported, and its command's observation not trusted. */
    C(io_uring_setup, WRITE, -1, -1, -1, -1, -1),
#endif
};
#define NCALLS (sizeof CALLS / sizeof CALLS[0])

/* One call, as read while its thread waits. */
struct seen {
    pid_t pid;
    const struct call *call;
    char *path, *path2;
    char flags[8];
};

static FILE *out;
static const char *preload;

/* A NUL-terminated string from the caller, page by page (a read across into an unmapped page
   fails as a whole). NULL when it cannot be read or is longer than PATH_MAX. */
static char *read_string(pid_t pid, unsigned long addr) {
    char *buf = malloc(PATH_MAX + 1);
    size_t got = 0;
    if (!buf) return NULL;
    while (got < PATH_MAX) {
        size_t room = 4096 - ((addr + got) & 4095);
        if (room > PATH_MAX - got) room = PATH_MAX - got;
        struct iovec local = {buf + got, room}, remote = {(void *)(addr + got), room};
        ssize_t n = process_vm_readv(pid, &local, 1, &remote, 1, 0);
        if (n <= 0) { free(buf); return NULL; }
        if (memchr(buf + got, 0, (size_t)n)) return buf;
        got += (size_t)n;
    }
    free(buf);
    return NULL;
}

/* The folder a relative path is resolved against: the dirfd's or the working folder. */
static char *folder_of(pid_t pid, long dirfd) {
    char link[64], *target = malloc(PATH_MAX + 1);
    if (!target) return NULL;
    if (dirfd == AT_FDCWD)
        snprintf(link, sizeof link, "/proc/%d/cwd", pid);
    else
        snprintf(link, sizeof link, "/proc/%d/fd/%d", pid, (int)dirfd);
    ssize_t n = readlink(link, target, PATH_MAX);
    if (n <= 0 || target[0] != '/') { free(target); return NULL; }
    target[n] = 0;
    return target;
}

/* name under the folder base (an empty name: base itself), as a new string; NULL without memory. */
static char *under(const char *base, const char *name) {
    char *joined = malloc(strlen(base) + strlen(name) + 2);
    if (!joined) return NULL;
    if (!name[0]) strcpy(joined, base);
    else sprintf(joined, "%s%s%s", base, strcmp(base, "/") ? "/" : "", name);
    return joined;
}

/* The path argument `index` of a call, absolute; NULL (and '?' in flags) when it cannot be known. */
static char *path_arg(struct seen *c, const uint64_t *args, int dirfd_index, int index) {
    if (!args[index] && dirfd_index >= 0 && c->call->kind == WRITE) {
        /* utimensat(fd, NULL, ...), as futimens() calls it: the open file itself */
        char *file = folder_of(c->pid, (long)(int)args[dirfd_index]);
        if (!file) strcat(c->flags, "?");
        return file;
    }
    char *path = read_string(c->pid, args[index]);
    if (!path) { strcat(c->flags, "?"); return NULL; }
    if (path[0] == '/') return path;
    char *base = folder_of(c->pid, dirfd_index >= 0 ? (long)(int)args[dirfd_index] : AT_FDCWD);
    if (!base) { free(path); strcat(c->flags, "?"); return NULL; }
    char *joined = under(base, path);
    free(base);
    free(path);
    return joined;
}

/* What a connect or bind names: a Unix socket's path (absolute, as path_arg makes it), else
   "family N" with 's' in flags (another family, or a Unix socket by abstract name or none). */
static char *socket_address(pid_t pid, unsigned long addr, size_t len, char *flags) {
    struct sockaddr_un un;
    memset(&un, 0, sizeof un);
    if (len > sizeof un) len = sizeof un;
    struct iovec local = {&un, len}, remote = {(void *)addr, len};
    if (!addr || len < sizeof(sa_family_t) || process_vm_readv(pid, &local, 1, &remote, 1, 0) != (ssize_t)len) {
        strcat(flags, "?");
        return NULL;
    }
    if (un.sun_family == AF_UNIX && len > offsetof(struct sockaddr_un, sun_path) && un.sun_path[0]) {
        char name[sizeof un.sun_path + 1];
        memcpy(name, un.sun_path, sizeof un.sun_path);
        name[sizeof un.sun_path] = 0;
        if (name[0] == '/') return strdup(name);
        char *base = folder_of(pid, AT_FDCWD), *joined = base ? under(base, name) : NULL;
        free(base);
        if (!joined) strcat(flags, "?");
        return joined;
    }
    char *family = malloc(32);
    if (family) snprintf(family, 32, "family %d", (int)un.sun_family);
    strcat(flags, "s");
    return family;
}

/* Read what a call names, before the kernel acts on it. */
static void read_call(struct seen *c, const struct seccomp_data *data) {
    c->call = NULL;
    c->path = c->path2 = NULL;
    c->flags[0] = 0;
    for (size_t i = 0; i < NCALLS; i++)
        if (CALLS[i].nr == (long)data->nr) { c->call = &CALLS[i]; break; }
    const struct call *k = c->call;
    if (!k) return;
    const uint64_t *args = (const uint64_t *)data->args;
    unsigned long long flags = k->flags >= 0 ? args[k->flags] : 0;
    if (k->nr == SYS_openat2) {
        struct open_how how;
        struct iovec local = {&how, sizeof how}, remote = {(void *)args[2], sizeof how};
        int read = process_vm_readv(c->pid, &local, 1, &remote, 1, 0) == sizeof how;
        flags = read ? how.flags : 0;
        /* RESOLVE_IN_ROOT resolves "/x.h" under the descriptor's folder, and the other RESOLVE_
           bits make an open fail where a plain one, and this observer's own look, succeed: what
           was found there is not what the path names here. */
        if (!read || how.resolve) strcat(c->flags, "?");
    }
    int opens = k->nr == SYS_openat || k->nr == SYS_openat2;
#ifdef SYS_open
    opens = opens || k->nr == SYS_open;
#endif
    if (opens) {
        /* glibc's __O_TMPFILE holds O_DIRECTORY too: its own bit alone says O_TMPFILE, where an
           opendir's O_DIRECTORY is a read. */
        if (flags & (O_WRONLY | O_RDWR | O_CREAT | O_TRUNC | O_APPEND | (__O_TMPFILE & ~O_DIRECTORY)))
            strcat(c->flags, "w");
        if (flags & O_NOFOLLOW) strcat(c->flags, "n");
    } else if (k->flags >= 0) {
        if (flags & AT_SYMLINK_NOFOLLOW) strcat(c->flags, "n");
        if (flags & AT_EMPTY_PATH) strcat(c->flags, "e");
    }
    if (k->kind == SOCKET) {
        c->path = socket_address(c->pid, args[1], (size_t)args[2], c->flags);
    } else if (k->kind == MACHINE || k->kind == CHANNEL) {
        /* nothing to read: the call itself is what is logged */
    } else if (k->kind == LIST || k->nr == SYS_fchdir) {
        c->path = folder_of(c->pid, (long)(int)args[0]);
        if (!c->path) strcat(c->flags, "?");
    } else if (k->path >= 0) {
        char *name = strchr(c->flags, 'e') ? read_string(c->pid, args[k->path]) : NULL;
        if (name && !name[0]) {
            /* An open file's stat is judged by its open, seen before: only a program run by its
               descriptor needs the descriptor's path. */
            c->path = k->kind == EXEC ? folder_of(c->pid, (long)(int)args[k->dirfd]) : strdup("");
        } else {
            char *e = strchr(c->flags, 'e');
            if (e) memmove(e, e + 1, strlen(e));
            c->path = path_arg(c, args, k->dirfd, k->path);
        }
        free(name);
        if (k->path2 >= 0) c->path2 = path_arg(c, args, k->dirfd2, k->path2);
    } else {
        strcat(c->flags, "?");
    }
}

/* What the call will find at its path now, as an errno (0: something is there). */
static int look(const struct seen *c) {
    if (!c->path || !c->path[0] || c->call->kind == WRITE || c->call->kind == LIST || c->call->kind == CHDIR ||
        strchr(c->flags, 's'))
        return 0;
    struct stat st;
    int nofollow = c->call->kind == NOFOLLOW || strchr(c->flags, 'n');
    return (nofollow ? lstat(c->path, &st) : stat(c->path, &st)) ? errno : 0;
}

static void write_field(const char *s) {
    for (; *s; s++) {
        if (*s == '\t') fputs("\\t", out);
        else if (*s == '\n') fputs("\\n", out);
        else if (*s == '\\') fputs("\\\\", out);
        else putc(*s, out);
    }
}

static void write_call(const struct seen *c, int error) {
    if (preload && c->path && !strcmp(c->path, preload) && !c->path2) return;
    fprintf(out, "%d\t%s\t%d\t%s\t", c->pid, c->call->name, error, c->flags);
    if (c->path) write_field(c->path);
    if (c->path2) { putc('\t', out); write_field(c->path2); }
    putc('\n', out);
}

/* Calls already logged with something at their path (same call, flags and path): the log's reader
   keeps a path's first such answer, so a repeat is neither looked at nor logged again. Keys are
   "name\tflags\tpath" in an open-addressing table that only grows. */
static char **seen;
static size_t seen_slots, seen_used;

static size_t key_hash(const char *s) {
    size_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static char **seen_slot(char **table, size_t slots, const char *key) {
    size_t i = key_hash(key) & (slots - 1);
    while (table[i] && strcmp(table[i], key)) i = (i + 1) & (slots - 1);
    return &table[i];
}

static char *seen_key(const struct seen *c) {
    if (!c->path || c->path2) return NULL;
    char *key = malloc(strlen(c->call->name) + strlen(c->flags) + strlen(c->path) + 3);
    if (key) sprintf(key, "%s\t%s\t%s", c->call->name, c->flags, c->path);
    return key;
}

static int seen_before(const char *key) { return seen_slots && *seen_slot(seen, seen_slots, key) != NULL; }

static void remember_seen(char *key) {
    if (2 * (seen_used + 1) > seen_slots) {
        size_t slots = seen_slots ? 2 * seen_slots : 16384;
        char **table = calloc(slots, sizeof *table);
        if (!table) { free(key); return; }
        for (size_t i = 0; i < seen_slots; i++)
            if (seen[i]) *seen_slot(table, slots, seen[i]) = seen[i];
        free(seen);
        seen = table;
        seen_slots = slots;
    }
    char **slot = seen_slot(seen, seen_slots, key);
    if (*slot) { free(key); return; }
    *slot = key;
    seen_used++;
}

#ifndef SECCOMP_FILTER_FLAG_SPEC_ALLOW /* Linux 4.17; the listener below needs 5.0 */
#define SECCOMP_FILTER_FLAG_SPEC_ALLOW (1UL << 2)
#endif

/* The filter, installed by the command's process before it runs the command: every call of
   CALLS (and every call of another ABI, whose numbers differ) goes to the supervisor. */
static int install_filter(void) {
    struct sock_filter prog[5 + NCALLS + 2];
    size_t n = 0;
    prog[n++] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch));
    prog[n++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, ARCH, 1, 0);
    prog[n++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_USER_NOTIF);
    prog[n++] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr));
    /* x32's calls come with this ABI's arch and their own numbers, from 0x40000000 */
    prog[n++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, 0x40000000u, (__u8)(NCALLS + 1), 0);
    for (size_t i = 0; i < NCALLS; i++)
        prog[n++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (__u32)CALLS[i].nr,
                                                 (__u8)(NCALLS - i), 0);
    prog[n++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW);
    prog[n++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_USER_NOTIF);
    struct sock_fprog fprog = {(unsigned short)n, prog};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)) return -1;
    /* SPEC_ALLOW: the filter observes, it does not sandbox. Without it a kernel booted with
       spec_store_bypass_disable=seccomp (the default before Linux 5.16) turns on Speculative Store
       Bypass Disable for the whole compile, which slows a compiler by several percent. */
    return (int)syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER,
                        SECCOMP_FILTER_FLAG_NEW_LISTENER | SECCOMP_FILTER_FLAG_SPEC_ALLOW, &fprog);
}

static int send_fd(int sock, int fd) {
    char byte = 0, control[CMSG_SPACE(sizeof(int))];
    struct iovec io = {&byte, 1};
    struct msghdr msg = {.msg_iov = &io, .msg_iovlen = 1, .msg_control = control, .msg_controllen = sizeof control};
    struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cm), &fd, sizeof fd);
    return sendmsg(sock, &msg, 0) == 1 ? 0 : -1;
}

static int receive_fd(int sock) {
    char byte, control[CMSG_SPACE(sizeof(int))];
    struct iovec io = {&byte, 1};
    struct msghdr msg = {.msg_iov = &io, .msg_iovlen = 1, .msg_control = control, .msg_controllen = sizeof control};
    if (recvmsg(sock, &msg, 0) != 1) return -1;
    struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
    if (!cm || cm->cmsg_type != SCM_RIGHTS) return -1;
    int fd;
    memcpy(&fd, CMSG_DATA(cm), sizeof fd);
    return fd;
}

int main(int argc, char **argv) {
    if (argc > 2 && !strcmp(argv[1], "--preload")) {
        preload = argv[2];
        argv += 2;
        argc -= 2;
    }
    if (argc < 3) {
        fprintf(stderr, "usage: pp4-observe [--preload LIB] LOG COMMAND [ARG...]\n");
        return 125;
    }
    out = fopen(argv[1], "w");
    if (!out) { fprintf(stderr, "pp4-observe: cannot write %s: %s\n", argv[1], strerror(errno)); return 125; }
    setvbuf(out, NULL, _IOFBF, 1 << 20);
    int pair[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair)) { perror("pp4-observe: socketpair"); return 125; }
    pid_t child = fork();
    if (child < 0) { perror("pp4-observe: fork"); return 125; }
    if (child == 0) {
        int listener = install_filter();
        if (listener < 0) {
            fprintf(stderr, "pp4-observe: cannot install the seccomp filter: %s\n", strerror(errno));
            _exit(125);
        }
        if (send_fd(pair[1], listener)) _exit(125);
        close(listener);
        /* The loader splits LD_PRELOAD at spaces and colons: a library whose path holds one is
           left out (it only saves time) rather than named in pieces the loader complains about. */
        if (preload && !strpbrk(preload, " :\t")) {
            const char *was = getenv("LD_PRELOAD");
            char *both = malloc(strlen(preload) + (was ? strlen(was) + 2 : 1));
            if (!both) _exit(125);
            sprintf(both, "%s%s%s", preload, was && *was ? ":" : "", was ? was : "");
            setenv("LD_PRELOAD", both, 1);
        }
        execvp(argv[2], argv + 2);
        fprintf(stderr, "pp4-observe: cannot run %s: %s\n", argv[2], strerror(errno));
        _exit(127);
    }
    close(pair[1]);
    int listener = receive_fd(pair[0]);
    close(pair[0]);
    int status = 0;
    if (listener < 0) {
        waitpid(child, &status, 0);
        return WIFEXITED(status) && WEXITSTATUS(status) ? WEXITSTATUS(status) : 125;
    }
#ifndef SECCOMP_IOCTL_NOTIF_SET_FLAGS
#define SECCOMP_IOCTL_NOTIF_SET_FLAGS SECCOMP_IOW(4, __u64)
#endif
#ifndef SECCOMP_USER_NOTIF_FD_SYNC_WAKE_UP
#define SECCOMP_USER_NOTIF_FD_SYNC_WAKE_UP (1UL << 0)
#endif
    ioctl(listener, SECCOMP_IOCTL_NOTIF_SET_FLAGS, SECCOMP_USER_NOTIF_FD_SYNC_WAKE_UP); /* EINVAL before 6.6 */
    struct seccomp_notif_sizes sizes;
    if (syscall(SYS_seccomp, SECCOMP_GET_NOTIF_SIZES, 0, &sizes)) { perror("pp4-observe: seccomp"); return 125; }
    struct seccomp_notif *req = calloc(1, sizes.seccomp_notif);
    struct seccomp_notif_resp *resp = calloc(1, sizes.seccomp_notif_resp);
    if (!req || !resp) { perror("pp4-observe"); return 125; }
    /* Until every process that holds the filter is gone: the kernel then hangs the listener up. */
    for (;;) {
        struct pollfd pfd = {listener, POLLIN, 0};
        if (poll(&pfd, 1, -1) < 0) {
            if (errno == EINTR) continue;
            perror("pp4-observe: poll");
            break;
        }
        if (!(pfd.revents & POLLIN)) {
            if (pfd.revents & (POLLHUP | POLLERR | POLLNVAL)) break;
            continue;
        }
        memset(req, 0, sizes.seccomp_notif);
        if (ioctl(listener, SECCOMP_IOCTL_NOTIF_RECV, req)) {
            if (errno == EINTR || errno == ENOENT) continue;
            perror("pp4-observe: receiving a call");
            break;
        }
        struct seen c = {.pid = (pid_t)req->pid};
        if (req->data.arch == ARCH) read_call(&c, &req->data);
        if (!c.call) {  /* another ABI's call: nothing this reads, so nothing pp4 can trust */
            fprintf(out, "%d\tforeign-abi-%d\t0\t?\t\n", c.pid, req->data.nr);
        } else {
            char *key = seen_key(&c);
            if (key && seen_before(key)) {
                free(key);  /* logged once with something there: the log's reader keeps that answer */
            } else if (c.path && !c.path[0] && strchr(c.flags, 'e')) {
                free(key);  /* the stat of an open file: its open was logged */
            } else {
                int error = look(&c);
                /* The thread may have died and its id gone to another since: then nothing read holds. */
                if (ioctl(listener, SECCOMP_IOCTL_NOTIF_ID_VALID, &req->id) == 0) {
                    write_call(&c, error);
                    if (key && error == 0) remember_seen(key), key = NULL;
                }
                free(key);
            }
            free(c.path);
            free(c.path2);
        }
        memset(resp, 0, sizes.seccomp_notif_resp);
        resp->id = req->id;
        resp->flags = SECCOMP_USER_NOTIF_FLAG_CONTINUE;
        ioctl(listener, SECCOMP_IOCTL_NOTIF_SEND, resp);  /* ENOENT: the caller is gone */
    }
    waitpid(child, &status, 0);
    fflush(out);
    if (ferror(out) || fclose(out)) { fprintf(stderr, "pp4-observe: cannot write %s\n", argv[1]); return 125; }
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}
