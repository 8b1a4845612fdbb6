/* pp4-observe: every path a command and all its children asked the kernel about, what was there,
   and every other system call that could bring in something pp4 cannot key.

       pp4-observe [--preload LIB] LOG COMMAND [ARG...]
       pp4-observe --table            (the table of system calls below, one "NR NAME CLASS" a line)

   Built by pp4 with the host C compiler (pp4/execution/observe.py). A seccomp filter, inherited by
   every process the command starts (static programs included: it acts on system calls, not library
   calls), lets the harmless calls of CALLS below through and hands every other call, of any number
   or ABI, to this supervisor as a user notification. A closed world: a call the table does not
   name is never let through unseen. The calling thread waits while its arguments are read from its
   memory and what is at a path is looked up (stat, or lstat where the call does not follow a final
   link); then the call goes on as the process made it. One line per call goes to LOG:

       PID <tab> CALL <tab> ERRNO <tab> FLAGS <tab> PATH [<tab> PATH2]

   A call whose name, flags and path were logged before with something there is not logged again
   (nor looked at: the log's reader keeps a path's first such answer), nor is the stat of an open
   file (an empty path: the open was logged).

   ERRNO is what the lookup found at the moment of the call (0: something is there). FLAGS: 'w'
   opened for writing, 'n' a final link not followed, 'e' an empty path (the call names an open
   file), '?' a path that could not be read or resolved, 'x' PATH2 is an extended attribute's name.
   Paths are absolute as the process named them (relative ones joined to its working folder or
   dirfd, nothing normalized); tab, newline and backslash are written as \t, \n and \\.

   Two more kinds of line:
       PID <tab> +exec <tab> PPID <tab> <tab> ARGC <tab> ARG... <tab> ENV...
                           after an execve that found its program: what the program was started
                           with (the driver's decisions, such as -march=native's expansion, are in
                           its children's arguments and environment)
       PID <tab> CALL <tab> 0 <tab> ! <tab> PROGRAM [<tab> DETAIL]
                           a call pp4 cannot observe (class UNSTORABLE below, an unknown number,
                           another ABI, an ioctl or fcntl request that asks outside the process):
                           the compile is never stored; logged once per call and program

   The exit status is the command's (128 + signal).

   The classes of CALLS (docs/reuse.md has the table with the reason for each):
       HARMLESS     learns nothing from outside the command's processes: memory, signals, its own
                    descriptors, processes and threads; let through by the filter
       UNKEYED      a value real compiles read whose answer changes no object of theirs: the
                    clock, randomness, resource limits and usage, memory statistics, the user's
                    ids; let through, not keyed (docs/reuse.md: out of reach, and why)
       ANSWERED     answered here, the same on every machine: the CPU set (one CPU), so that a
                    tool that sizes its work by it does the same everywhere
       READ ... XLIST
                    observed: a path, a descriptor's target or an extended attribute, logged
                    with what was there
       SOCKET       connect: to a Unix socket with nothing at its path, an absence observed like
                    any other (glibc's user lookups try nscd's socket first); to anything else, a
                    reach to another process or the network: UNSTORABLE
       IOCTL, FCNTL, SEND
                    the filter lets through the requests that ask only about the process's own
                    descriptors (a terminal's settings, close-on-exec, ...) and sends without an
                    address (on a socket whose connect was judged, or a pair of the process's
                    own); others are UNSTORABLE, except the NVIDIA driver's ioctls (what nvcc
                    learns there is keyed by its dry run)
       UNSTORABLE   anything else: giving a socket an address or a peer (bind, listen, accept),
                    other processes' memory, System V and POSIX IPC, the kernel's key store, the
                    machine's name, mounts, io_uring and asynchronous I/O, file system statistics,
                    administration

   Why this and not strace or a ptrace tracer: a notification costs one round trip to this process
   per call, where ptrace stops the caller twice (entry and exit) and strace also decodes and prints
   every argument. On a g++ unit of torch's headers (24,600 calls, 84% of them glibc realpath's
   readlink) that is about a third of strace's added CPU (bench/build/observe_overhead.py). It needs
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
#include <termios.h>
#include <unistd.h>

#if !defined(__x86_64__)
#error "pp4-observe's table is x86-64's system calls: pp4 runs on x86_64 Linux"
#endif
#define ARCH AUDIT_ARCH_X86_64

enum kind {
    HARMLESS, UNKEYED, ANSWERED,
    READ, NOFOLLOW, WRITE, LIST, EXEC, CHDIR, FDWRITE, XATTR, XATTR_NOFOLLOW, XLIST, XLIST_NOFOLLOW,
    SOCKET, IOCTL, FCNTL, SEND, UNSTORABLE
};
static const char *const KIND_NAMES[] = {
    "harmless", "unkeyed", "answered",
    "observed", "observed", "observed", "observed", "observed", "observed", "observed", "observed", "observed",
    "observed", "observed", "observed", "some-requests", "some-requests", "some-requests", "unstorable"
};

/* One system call of x86-64 and where its arguments are. dirfd: the argument holding the folder
   the path at `path` is relative to (-1: the working folder), or for a call on a descriptor
   (fchmod, fgetxattr, getdents, fchdir) the descriptor itself, with path -1. flags: the argument
   whose bits say write/nofollow/empty (-1: none). dirfd2/path2: a second path (rename, link).
   extra: an extended attribute's name. */
struct call {
    int nr;
    const char *name;
    enum kind kind;
    int dirfd, path, flags, dirfd2, path2, extra;
};

/* Every system call of x86-64 Linux to 6.18, by number (arch/x86/entry/syscalls/syscall_64.tbl).
   tests/test_observe.py fails when the running kernel has one this table does not name. K: a call
   whose arguments nothing reads; P: one whose path, descriptor or name arguments are read. */
#define K(nr, name, kind) {nr, #name, kind, -1, -1, -1, -1, -1, -1}
#define P(nr, name, kind, dirfd, path, flags, dirfd2, path2, extra) {nr, #name, kind, dirfd, path, flags, dirfd2, path2, extra}
static const struct call CALLS[] = {
    K(0, read, HARMLESS),
    K(1, write, HARMLESS),
    P(2, open, READ, -1, 0, 1, -1, -1, -1),
    K(3, close, HARMLESS),
    P(4, stat, READ, -1, 0, -1, -1, -1, -1),
    K(5, fstat, HARMLESS),
    P(6, lstat, NOFOLLOW, -1, 0, -1, -1, -1, -1),
    K(7, poll, HARMLESS),
    K(8, lseek, HARMLESS),
    K(9, mmap, HARMLESS),
    K(10, mprotect, HARMLESS),
    K(11, munmap, HARMLESS),
    K(12, brk, HARMLESS),
    K(13, rt_sigaction, HARMLESS),
    K(14, rt_sigprocmask, HARMLESS),
    K(15, rt_sigreturn, HARMLESS),
    K(16, ioctl, IOCTL),
    K(17, pread64, HARMLESS),
    K(18, pwrite64, HARMLESS),
    K(19, readv, HARMLESS),
    K(20, writev, HARMLESS),
    P(21, access, READ, -1, 0, -1, -1, -1, -1),
    K(22, pipe, HARMLESS),
    K(23, select, HARMLESS),
    K(24, sched_yield, HARMLESS),
    K(25, mremap, HARMLESS),
    K(26, msync, HARMLESS),
    K(27, mincore, UNSTORABLE),
    K(28, madvise, HARMLESS),
    K(29, shmget, UNSTORABLE),
    K(30, shmat, UNSTORABLE),
    K(31, shmctl, UNSTORABLE),
    K(32, dup, HARMLESS),
    K(33, dup2, HARMLESS),
    K(34, pause, HARMLESS),
    K(35, nanosleep, HARMLESS),
    K(36, getitimer, HARMLESS),
    K(37, alarm, HARMLESS),
    K(38, setitimer, HARMLESS),
    K(39, getpid, HARMLESS),
    K(40, sendfile, HARMLESS),
    K(41, socket, HARMLESS),
    K(42, connect, SOCKET),
    K(43, accept, UNSTORABLE),
    K(44, sendto, SEND),
    K(45, recvfrom, HARMLESS),
    K(46, sendmsg, SEND),
    K(47, recvmsg, HARMLESS),
    K(48, shutdown, HARMLESS),
    K(49, bind, UNSTORABLE),
    K(50, listen, UNSTORABLE),
    K(51, getsockname, HARMLESS),
    K(52, getpeername, HARMLESS),
    K(53, socketpair, HARMLESS),
    K(54, setsockopt, HARMLESS),
    K(55, getsockopt, HARMLESS),
    K(56, clone, HARMLESS),
    K(57, fork, HARMLESS),
    K(58, vfork, HARMLESS),
    P(59, execve, EXEC, -1, 0, -1, -1, -1, -1),
    K(60, exit, HARMLESS),
    K(61, wait4, HARMLESS),
    K(62, kill, HARMLESS),
    K(63, uname, UNSTORABLE),
    K(64, semget, UNSTORABLE),
    K(65, semop, UNSTORABLE),
    K(66, semctl, UNSTORABLE),
    K(67, shmdt, UNSTORABLE),
    K(68, msgget, UNSTORABLE),
    K(69, msgsnd, UNSTORABLE),
    K(70, msgrcv, UNSTORABLE),
    K(71, msgctl, UNSTORABLE),
    K(72, fcntl, FCNTL),
    K(73, flock, HARMLESS),
    K(74, fsync, HARMLESS),
    K(75, fdatasync, HARMLESS),
    P(76, truncate, WRITE, -1, 0, -1, -1, -1, -1),
    K(77, ftruncate, HARMLESS),
    P(78, getdents, LIST, 0, -1, -1, -1, -1, -1),
    K(79, getcwd, HARMLESS),
    P(80, chdir, CHDIR, -1, 0, -1, -1, -1, -1),
    P(81, fchdir, CHDIR, 0, -1, -1, -1, -1, -1),
    P(82, rename, WRITE, -1, 0, -1, -1, 1, -1),
    P(83, mkdir, WRITE, -1, 0, -1, -1, -1, -1),
    P(84, rmdir, WRITE, -1, 0, -1, -1, -1, -1),
    P(85, creat, WRITE, -1, 0, -1, -1, -1, -1),
    P(86, link, WRITE, -1, 0, -1, -1, 1, -1),
    P(87, unlink, WRITE, -1, 0, -1, -1, -1, -1),
    P(88, symlink, WRITE, -1, 1, -1, -1, -1, -1),
    P(89, readlink, NOFOLLOW, -1, 0, -1, -1, -1, -1),
    P(90, chmod, WRITE, -1, 0, -1, -1, -1, -1),
    P(91, fchmod, FDWRITE, 0, -1, -1, -1, -1, -1),
    P(92, chown, WRITE, -1, 0, -1, -1, -1, -1),
    P(93, fchown, FDWRITE, 0, -1, -1, -1, -1, -1),
    P(94, lchown, WRITE, -1, 0, -1, -1, -1, -1),
    K(95, umask, HARMLESS),
    K(96, gettimeofday, UNKEYED),
    K(97, getrlimit, UNKEYED),
    K(98, getrusage, UNKEYED),
    K(99, sysinfo, UNKEYED),
    K(100, times, UNKEYED),
    K(101, ptrace, UNSTORABLE),
    K(102, getuid, UNKEYED),
    K(103, syslog, UNSTORABLE),
    K(104, getgid, UNKEYED),
    K(105, setuid, HARMLESS),
    K(106, setgid, HARMLESS),
    K(107, geteuid, UNKEYED),
    K(108, getegid, UNKEYED),
    K(109, setpgid, HARMLESS),
    K(110, getppid, HARMLESS),
    K(111, getpgrp, HARMLESS),
    K(112, setsid, HARMLESS),
    K(113, setreuid, HARMLESS),
    K(114, setregid, HARMLESS),
    K(115, getgroups, UNKEYED),
    K(116, setgroups, HARMLESS),
    K(117, setresuid, HARMLESS),
    K(118, getresuid, UNKEYED),
    K(119, setresgid, HARMLESS),
    K(120, getresgid, UNKEYED),
    K(121, getpgid, HARMLESS),
    K(122, setfsuid, HARMLESS),
    K(123, setfsgid, HARMLESS),
    K(124, getsid, HARMLESS),
    K(125, capget, HARMLESS),
    K(126, capset, HARMLESS),
    K(127, rt_sigpending, HARMLESS),
    K(128, rt_sigtimedwait, HARMLESS),
    K(129, rt_sigqueueinfo, HARMLESS),
    K(130, rt_sigsuspend, HARMLESS),
    K(131, sigaltstack, HARMLESS),
    P(132, utime, WRITE, -1, 0, -1, -1, -1, -1),
    P(133, mknod, WRITE, -1, 0, -1, -1, -1, -1),
    K(134, uselib, UNSTORABLE),
    K(135, personality, HARMLESS),
    K(136, ustat, UNSTORABLE),
    K(137, statfs, UNSTORABLE),
    K(138, fstatfs, UNSTORABLE),
    K(139, sysfs, UNSTORABLE),
    K(140, getpriority, UNKEYED),
    K(141, setpriority, HARMLESS),
    K(142, sched_setparam, HARMLESS),
    K(143, sched_getparam, UNKEYED),
    K(144, sched_setscheduler, HARMLESS),
    K(145, sched_getscheduler, UNKEYED),
    K(146, sched_get_priority_max, HARMLESS),
    K(147, sched_get_priority_min, HARMLESS),
    K(148, sched_rr_get_interval, UNKEYED),
    K(149, mlock, HARMLESS),
    K(150, munlock, HARMLESS),
    K(151, mlockall, HARMLESS),
    K(152, munlockall, HARMLESS),
    K(153, vhangup, UNSTORABLE),
    K(154, modify_ldt, HARMLESS),
    K(155, pivot_root, UNSTORABLE),
    K(156, _sysctl, UNSTORABLE),
    K(157, prctl, HARMLESS),
    K(158, arch_prctl, HARMLESS),
    K(159, adjtimex, UNSTORABLE),
    K(160, setrlimit, HARMLESS),
    K(161, chroot, UNSTORABLE),
    K(162, sync, HARMLESS),
    K(163, acct, UNSTORABLE),
    K(164, settimeofday, UNSTORABLE),
    K(165, mount, UNSTORABLE),
    K(166, umount2, UNSTORABLE),
    K(167, swapon, UNSTORABLE),
    K(168, swapoff, UNSTORABLE),
    K(169, reboot, UNSTORABLE),
    K(170, sethostname, UNSTORABLE),
    K(171, setdomainname, UNSTORABLE),
    K(172, iopl, UNSTORABLE),
    K(173, ioperm, UNSTORABLE),
    K(174, create_module, UNSTORABLE),
    K(175, init_module, UNSTORABLE),
    K(176, delete_module, UNSTORABLE),
    K(177, get_kernel_syms, UNSTORABLE),
    K(178, query_module, UNSTORABLE),
    K(179, quotactl, UNSTORABLE),
    K(180, nfsservctl, UNSTORABLE),
    K(181, getpmsg, UNSTORABLE),
    K(182, putpmsg, UNSTORABLE),
    K(183, afs_syscall, UNSTORABLE),
    K(184, tuxcall, UNSTORABLE),
    K(185, security, UNSTORABLE),
    K(186, gettid, HARMLESS),
    K(187, readahead, HARMLESS),
    P(188, setxattr, WRITE, -1, 0, -1, -1, -1, -1),
    P(189, lsetxattr, WRITE, -1, 0, -1, -1, -1, -1),
    P(190, fsetxattr, FDWRITE, 0, -1, -1, -1, -1, -1),
    P(191, getxattr, XATTR, -1, 0, -1, -1, -1, 1),
    P(192, lgetxattr, XATTR_NOFOLLOW, -1, 0, -1, -1, -1, 1),
    P(193, fgetxattr, XATTR, 0, -1, -1, -1, -1, 1),
    P(194, listxattr, XLIST, -1, 0, -1, -1, -1, -1),
    P(195, llistxattr, XLIST_NOFOLLOW, -1, 0, -1, -1, -1, -1),
    P(196, flistxattr, XLIST, 0, -1, -1, -1, -1, -1),
    P(197, removexattr, WRITE, -1, 0, -1, -1, -1, -1),
    P(198, lremovexattr, WRITE, -1, 0, -1, -1, -1, -1),
    P(199, fremovexattr, FDWRITE, 0, -1, -1, -1, -1, -1),
    K(200, tkill, HARMLESS),
    K(201, time, UNKEYED),
    K(202, futex, HARMLESS),
    K(203, sched_setaffinity, HARMLESS),
    K(204, sched_getaffinity, ANSWERED),
    K(205, set_thread_area, HARMLESS),
    K(206, io_setup, UNSTORABLE),
    K(207, io_destroy, UNSTORABLE),
    K(208, io_getevents, UNSTORABLE),
    K(209, io_submit, UNSTORABLE),
    K(210, io_cancel, UNSTORABLE),
    K(211, get_thread_area, HARMLESS),
    K(212, lookup_dcookie, UNSTORABLE),
    K(213, epoll_create, HARMLESS),
    K(214, epoll_ctl_old, UNSTORABLE),
    K(215, epoll_wait_old, UNSTORABLE),
    K(216, remap_file_pages, HARMLESS),
    P(217, getdents64, LIST, 0, -1, -1, -1, -1, -1),
    K(218, set_tid_address, HARMLESS),
    K(219, restart_syscall, HARMLESS),
    K(220, semtimedop, UNSTORABLE),
    K(221, fadvise64, HARMLESS),
    K(222, timer_create, HARMLESS),
    K(223, timer_settime, HARMLESS),
    K(224, timer_gettime, HARMLESS),
    K(225, timer_getoverrun, HARMLESS),
    K(226, timer_delete, HARMLESS),
    K(227, clock_settime, UNSTORABLE),
    K(228, clock_gettime, UNKEYED),
    K(229, clock_getres, UNKEYED),
    K(230, clock_nanosleep, HARMLESS),
    K(231, exit_group, HARMLESS),
    K(232, epoll_wait, HARMLESS),
    K(233, epoll_ctl, HARMLESS),
    K(234, tgkill, HARMLESS),
    P(235, utimes, WRITE, -1, 0, -1, -1, -1, -1),
    K(236, vserver, UNSTORABLE),
    K(237, mbind, HARMLESS),
    K(238, set_mempolicy, HARMLESS),
    K(239, get_mempolicy, UNSTORABLE),
    K(240, mq_open, UNSTORABLE),
    K(241, mq_unlink, UNSTORABLE),
    K(242, mq_timedsend, UNSTORABLE),
    K(243, mq_timedreceive, UNSTORABLE),
    K(244, mq_notify, UNSTORABLE),
    K(245, mq_getsetattr, UNSTORABLE),
    K(246, kexec_load, UNSTORABLE),
    K(247, waitid, HARMLESS),
    K(248, add_key, UNSTORABLE),
    K(249, request_key, UNSTORABLE),
    K(250, keyctl, UNSTORABLE),
    K(251, ioprio_set, HARMLESS),
    K(252, ioprio_get, UNKEYED),
    K(253, inotify_init, HARMLESS),
    K(254, inotify_add_watch, UNSTORABLE),
    K(255, inotify_rm_watch, HARMLESS),
    K(256, migrate_pages, UNSTORABLE),
    P(257, openat, READ, 0, 1, 2, -1, -1, -1),
    P(258, mkdirat, WRITE, 0, 1, -1, -1, -1, -1),
    P(259, mknodat, WRITE, 0, 1, -1, -1, -1, -1),
    P(260, fchownat, WRITE, 0, 1, -1, -1, -1, -1),
    P(261, futimesat, WRITE, 0, 1, -1, -1, -1, -1),
    P(262, newfstatat, READ, 0, 1, 3, -1, -1, -1),
    P(263, unlinkat, WRITE, 0, 1, -1, -1, -1, -1),
    P(264, renameat, WRITE, 0, 1, -1, 2, 3, -1),
    P(265, linkat, WRITE, 0, 1, -1, 2, 3, -1),
    P(266, symlinkat, WRITE, 1, 2, -1, -1, -1, -1),
    P(267, readlinkat, NOFOLLOW, 0, 1, -1, -1, -1, -1),
    P(268, fchmodat, WRITE, 0, 1, -1, -1, -1, -1),
    P(269, faccessat, READ, 0, 1, -1, -1, -1, -1),
    K(270, pselect6, HARMLESS),
    K(271, ppoll, HARMLESS),
    K(272, unshare, UNSTORABLE),
    K(273, set_robust_list, HARMLESS),
    K(274, get_robust_list, HARMLESS),
    K(275, splice, HARMLESS),
    K(276, tee, HARMLESS),
    K(277, sync_file_range, HARMLESS),
    K(278, vmsplice, HARMLESS),
    K(279, move_pages, UNSTORABLE),
    P(280, utimensat, WRITE, 0, 1, -1, -1, -1, -1),
    K(281, epoll_pwait, HARMLESS),
    K(282, signalfd, HARMLESS),
    K(283, timerfd_create, HARMLESS),
    K(284, eventfd, HARMLESS),
    K(285, fallocate, HARMLESS),
    K(286, timerfd_settime, HARMLESS),
    K(287, timerfd_gettime, HARMLESS),
    K(288, accept4, UNSTORABLE),
    K(289, signalfd4, HARMLESS),
    K(290, eventfd2, HARMLESS),
    K(291, epoll_create1, HARMLESS),
    K(292, dup3, HARMLESS),
    K(293, pipe2, HARMLESS),
    K(294, inotify_init1, HARMLESS),
    K(295, preadv, HARMLESS),
    K(296, pwritev, HARMLESS),
    K(297, rt_tgsigqueueinfo, HARMLESS),
    K(298, perf_event_open, UNSTORABLE),
    K(299, recvmmsg, HARMLESS),
    K(300, fanotify_init, UNSTORABLE),
    K(301, fanotify_mark, UNSTORABLE),
    K(302, prlimit64, UNKEYED),
    K(303, name_to_handle_at, UNSTORABLE),
    K(304, open_by_handle_at, UNSTORABLE),
    K(305, clock_adjtime, UNSTORABLE),
    K(306, syncfs, HARMLESS),
    K(307, sendmmsg, UNSTORABLE),
    K(308, setns, UNSTORABLE),
    K(309, getcpu, UNKEYED),
    K(310, process_vm_readv, UNSTORABLE),
    K(311, process_vm_writev, UNSTORABLE),
    K(312, kcmp, UNSTORABLE),
    K(313, finit_module, UNSTORABLE),
    K(314, sched_setattr, HARMLESS),
    K(315, sched_getattr, UNKEYED),
    P(316, renameat2, WRITE, 0, 1, -1, 2, 3, -1),
    K(317, seccomp, HARMLESS),
    K(318, getrandom, UNKEYED),
    K(319, memfd_create, HARMLESS),
    K(320, kexec_file_load, UNSTORABLE),
    K(321, bpf, UNSTORABLE),
    P(322, execveat, EXEC, 0, 1, 4, -1, -1, -1),
    K(323, userfaultfd, UNSTORABLE),
    K(324, membarrier, HARMLESS),
    K(325, mlock2, HARMLESS),
    K(326, copy_file_range, HARMLESS),
    K(327, preadv2, HARMLESS),
    K(328, pwritev2, HARMLESS),
    K(329, pkey_mprotect, HARMLESS),
    K(330, pkey_alloc, HARMLESS),
    K(331, pkey_free, HARMLESS),
    P(332, statx, READ, 0, 1, 2, -1, -1, -1),
    K(333, io_pgetevents, UNSTORABLE),
    K(334, rseq, HARMLESS),
    K(335, uretprobe, HARMLESS),
    K(336, uprobe, HARMLESS),
    K(424, pidfd_send_signal, HARMLESS),
    K(425, io_uring_setup, UNSTORABLE),
    K(426, io_uring_enter, UNSTORABLE),
    K(427, io_uring_register, UNSTORABLE),
    K(428, open_tree, UNSTORABLE),
    K(429, move_mount, UNSTORABLE),
    K(430, fsopen, UNSTORABLE),
    K(431, fsconfig, UNSTORABLE),
    K(432, fsmount, UNSTORABLE),
    K(433, fspick, UNSTORABLE),
    K(434, pidfd_open, HARMLESS),
    K(435, clone3, HARMLESS),
    K(436, close_range, HARMLESS),
    P(437, openat2, READ, 0, 1, 2, -1, -1, -1),
    K(438, pidfd_getfd, UNSTORABLE),
    P(439, faccessat2, READ, 0, 1, 3, -1, -1, -1),
    K(440, process_madvise, UNSTORABLE),
    K(441, epoll_pwait2, HARMLESS),
    K(442, mount_setattr, UNSTORABLE),
    K(443, quotactl_fd, UNSTORABLE),
    K(444, landlock_create_ruleset, HARMLESS),
    K(445, landlock_add_rule, HARMLESS),
    K(446, landlock_restrict_self, HARMLESS),
    K(447, memfd_secret, HARMLESS),
    K(448, process_mrelease, UNSTORABLE),
    K(449, futex_waitv, HARMLESS),
    K(450, set_mempolicy_home_node, HARMLESS),
    K(451, cachestat, UNSTORABLE),
    P(452, fchmodat2, WRITE, 0, 1, -1, -1, -1, -1),
    K(453, map_shadow_stack, HARMLESS),
    K(454, futex_wake, HARMLESS),
    K(455, futex_wait, HARMLESS),
    K(456, futex_requeue, HARMLESS),
    K(457, statmount, UNSTORABLE),
    K(458, listmount, UNSTORABLE),
    K(459, lsm_get_self_attr, UNSTORABLE),
    K(460, lsm_set_self_attr, UNSTORABLE),
    K(461, lsm_list_modules, UNSTORABLE),
    K(462, mseal, HARMLESS),
    P(463, setxattrat, WRITE, 0, 1, -1, -1, -1, -1),
    P(464, getxattrat, XATTR, 0, 1, 2, -1, -1, 3),
    P(465, listxattrat, XLIST, 0, 1, 2, -1, -1, -1),
    P(466, removexattrat, WRITE, 0, 1, -1, -1, -1, -1),
    K(467, open_tree_attr, UNSTORABLE),
    K(468, file_getattr, UNSTORABLE),
    K(469, file_setattr, UNSTORABLE),
};
#define NCALLS (sizeof CALLS / sizeof CALLS[0])
#define MAXNR 1024
static const struct call *BY_NR[MAXNR];

/* ioctl requests that ask only about the caller's own descriptor (is it a terminal, its window,
   its blocking and close-on-exec flags, what is waiting to be read): let through by the filter. */
static const unsigned OWN_IOCTLS[] = {TCGETS, TIOCGWINSZ, TIOCGPGRP, FIONBIO, FIOCLEX, FIONCLEX, FIONREAD};
/* fcntl commands that ask about other processes (their locks and leases on a file): the rest are
   the descriptor's own. */
static const unsigned OTHERS_FCNTLS[] = {F_GETLK, F_OFD_GETLK, F_GETLEASE};

/* One call, as read while its thread waits. */
struct seen {
    pid_t pid;
    const struct call *call;
    char *path, *path2;
    char flags[8];
};

static FILE *out;
static const char *preload;
static int channel = -1;  /* the socket the filtered child sends the listener on: its one sendmsg */

/* Bytes of the caller's memory; 0 when all of them could be read. */
static int read_memory(pid_t pid, unsigned long addr, void *into, size_t n) {
    struct iovec local = {into, n}, remote = {(void *)addr, n};
    return process_vm_readv(pid, &local, 1, &remote, 1, 0) == (ssize_t)n ? 0 : -1;
}

/* A NUL-terminated string from the caller, page by page (a read across into an unmapped page
   fails as a whole). NULL when it cannot be read or is longer than limit. */
static char *read_limited(pid_t pid, unsigned long addr, size_t limit) {
    char *buf = malloc(limit + 1);
    size_t got = 0;
    if (!buf) return NULL;
    while (got < limit) {
        size_t room = 4096 - ((addr + got) & 4095);
        if (room > limit - got) room = limit - got;
        struct iovec local = {buf + got, room}, remote = {(void *)(addr + got), room};
        ssize_t n = process_vm_readv(pid, &local, 1, &remote, 1, 0);
        if (n <= 0) { free(buf); return NULL; }
        if (memchr(buf + got, 0, (size_t)n)) return buf;
        got += (size_t)n;
    }
    free(buf);
    return NULL;
}

static char *read_string(pid_t pid, unsigned long addr) { return read_limited(pid, addr, PATH_MAX); }

/* The folder a relative path is resolved against: the dirfd's or the working folder (also: the
   target of any descriptor). */
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

/* What a process is running (for the lines that name a program). */
static char *program_of(pid_t pid) {
    char link[64], *target = malloc(PATH_MAX + 1);
    if (!target) return NULL;
    snprintf(link, sizeof link, "/proc/%d/exe", pid);
    ssize_t n = readlink(link, target, PATH_MAX);
    if (n <= 0) strcpy(target, "?");
    else target[n] = 0;
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

/* A connect's Unix socket path (absolute), or NULL with what it is instead in `detail`
   (another family, an abstract name, an address that cannot be read). */
static char *socket_path(pid_t pid, unsigned long addr, size_t len, char *detail, size_t room) {
    struct sockaddr_un un;
    memset(&un, 0, sizeof un);
    if (len > sizeof un) len = sizeof un;
    if (!addr || len < sizeof(sa_family_t) || read_memory(pid, addr, &un, len)) {
        snprintf(detail, room, "an address that cannot be read");
        return NULL;
    }
    if (un.sun_family != AF_UNIX || len <= offsetof(struct sockaddr_un, sun_path) || !un.sun_path[0]) {
        snprintf(detail, room, un.sun_family == AF_UNIX ? "an abstract Unix socket" : "address family %d",
                 (int)un.sun_family);
        return NULL;
    }
    char name[sizeof un.sun_path + 1];
    memcpy(name, un.sun_path, sizeof un.sun_path);
    name[sizeof un.sun_path] = 0;
    if (name[0] == '/') return strdup(name);
    char *base = folder_of(pid, AT_FDCWD), *joined = base ? under(base, name) : NULL;
    free(base);
    if (!joined) snprintf(detail, room, "a relative socket path in a folder that cannot be read");
    return joined;
}

/* Read what a call names, before the kernel acts on it. */
static void read_call(struct seen *c, const struct seccomp_data *data) {
    c->call = data->nr >= 0 && data->nr < MAXNR ? BY_NR[data->nr] : NULL;
    c->path = c->path2 = NULL;
    c->flags[0] = 0;
    const struct call *k = c->call;
    if (!k || k->kind < READ || k->kind > XLIST_NOFOLLOW) return;
    const uint64_t *args = (const uint64_t *)data->args;
    unsigned long long flags = k->flags >= 0 ? args[k->flags] : 0;
    if (k->nr == SYS_openat2) {
        struct open_how how;
        int read = read_memory(c->pid, args[2], &how, sizeof how) == 0;
        flags = read ? how.flags : 0;
        /* RESOLVE_IN_ROOT resolves "/x.h" under the descriptor's folder, and the other RESOLVE_
           bits make an open fail where a plain one, and this observer's own look, succeed: what
           was found there is not what the path names here. */
        if (!read || how.resolve) strcat(c->flags, "?");
    }
    if (k->nr == SYS_openat || k->nr == SYS_openat2 || k->nr == SYS_open) {
        /* glibc's __O_TMPFILE holds O_DIRECTORY too: its own bit alone says O_TMPFILE, where an
           opendir's O_DIRECTORY is a read. */
        if (flags & (O_WRONLY | O_RDWR | O_CREAT | O_TRUNC | O_APPEND | (__O_TMPFILE & ~O_DIRECTORY)))
            strcat(c->flags, "w");
        if (flags & O_NOFOLLOW) strcat(c->flags, "n");
    } else if (k->flags >= 0) {
        if (flags & AT_SYMLINK_NOFOLLOW) strcat(c->flags, "n");
        if (flags & AT_EMPTY_PATH) strcat(c->flags, "e");
    }
    if (k->kind == XATTR_NOFOLLOW || k->kind == XLIST_NOFOLLOW) strcat(c->flags, "n");
    if (k->path < 0) {
        /* a call on a descriptor: what it names is the descriptor's target */
        c->path = folder_of(c->pid, (long)(int)args[k->dirfd]);
        if (!c->path) strcat(c->flags, "?");
    } else {
        char *name = strchr(c->flags, 'e') ? read_string(c->pid, args[k->path]) : NULL;
        if (name && !name[0]) {
            /* An open file's stat is judged by its open, seen before: a program run by its
               descriptor, and an attribute read through one, need the descriptor's path. */
            c->path = k->kind == EXEC || k->kind == XATTR || k->kind == XLIST ? folder_of(c->pid, (long)(int)args[k->dirfd])
                                                                              : strdup("");
            if (!c->path) strcat(c->flags, "?");
        } else {
            char *e = strchr(c->flags, 'e');
            if (e) memmove(e, e + 1, strlen(e));
            c->path = path_arg(c, args, k->dirfd, k->path);
        }
        free(name);
    }
    if (k->path2 >= 0) c->path2 = path_arg(c, args, k->dirfd2, k->path2);
    if (k->extra >= 0) {
        c->path2 = read_limited(c->pid, args[k->extra], 256);  /* XATTR_NAME_MAX is 255 */
        if (!c->path2) strcat(c->flags, "?");
        strcat(c->flags, "x");
    }
}

/* What the call will find at its path now, as an errno (0: something is there). */
static int look(const struct seen *c) {
    enum kind kind = c->call->kind;
    if (!c->path || !c->path[0] || kind == WRITE || kind == FDWRITE || kind == LIST || kind == CHDIR)
        return 0;
    struct stat st;
    int nofollow = kind == NOFOLLOW || strchr(c->flags, 'n');
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

/* Lines already logged, as "name\tflags\tpath" keys in an open-addressing table that only grows:
   a call logged with something at its path (the log's reader keeps a path's first such answer),
   and each unstorable call of each program. */
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

static char *seen_key(const char *name, const char *flags, const char *path, const char *path2) {
    if (!path || (path2 && !strchr(flags, 'x'))) return NULL;
    char *key = malloc(strlen(name) + strlen(flags) + strlen(path) + (path2 ? strlen(path2) : 0) + 4);
    if (key) sprintf(key, "%s\t%s\t%s\t%s", name, flags, path, path2 ? path2 : "");
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

/* A call pp4 cannot observe: one line per call name and program. */
static void unstorable(pid_t pid, const char *name, const char *detail) {
    char *program = program_of(pid);
    if (!program) return;
    char *key = seen_key(name, "!", program, NULL);
    if (key && !seen_before(key)) {
        fprintf(out, "%d\t%s\t0\t!\t", pid, name);
        write_field(program);
        if (detail) { putc('\t', out); write_field(detail); }
        putc('\n', out);
        remember_seen(key);
    } else {
        free(key);
    }
    free(program);
}

/* After an execve that found its program: the program's arguments and environment, read from the
   caller (argv and envp are arrays of pointers, NULL-terminated). */
static void write_exec(pid_t pid, const struct call *k, const uint64_t *args) {
    int argv_at = k->nr == SYS_execveat ? 2 : 1;
    char status[64], line[256];
    pid_t ppid = 0;
    snprintf(status, sizeof status, "/proc/%d/status", pid);
    FILE *f = fopen(status, "r");
    if (f) {
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "PPid: %d", &ppid) == 1) break;
        fclose(f);
    }
    char **strings[2] = {NULL, NULL};
    size_t counts[2] = {0, 0};
    int broken = 0;
    for (int which = 0; which < 2 && !broken; which++) {
        unsigned long array = args[argv_at + which];
        size_t cap = 0;
        for (size_t i = 0; array && i < 65536; i++) {
            uint64_t ptr;
            if (read_memory(pid, array + 8 * i, &ptr, sizeof ptr)) { broken = 1; break; }
            if (!ptr) break;
            char *s = read_limited(pid, ptr, 131072);  /* MAX_ARG_STRLEN */
            if (!s) { broken = 1; break; }
            if (counts[which] == cap) {
                cap = cap ? 2 * cap : 64;
                char **grown = realloc(strings[which], cap * sizeof *grown);
                if (!grown) { free(s); broken = 1; break; }
                strings[which] = grown;
            }
            strings[which][counts[which]++] = s;
        }
    }
    fprintf(out, "%d\t+exec\t%d\t%s\t%zu", pid, (int)ppid, broken ? "?" : "", counts[0]);
    for (int which = 0; which < 2; which++)
        for (size_t i = 0; i < counts[which]; i++) {
            putc('\t', out);
            write_field(strings[which][i]);
            free(strings[which][i]);
        }
    putc('\n', out);
    free(strings[0]);
    free(strings[1]);
}

#ifndef SECCOMP_FILTER_FLAG_SPEC_ALLOW /* Linux 4.17; the listener below needs 5.0 */
#define SECCOMP_FILTER_FLAG_SPEC_ALLOW (1UL << 2)
#endif

#define ALLOW SECCOMP_RET_ALLOW
#define NOTIFY SECCOMP_RET_USER_NOTIF
#define MAXPROG 4000

struct program { struct sock_filter ins[MAXPROG]; size_t n; };

static void emit(struct program *p, struct sock_filter ins) { if (p->n < MAXPROG) p->ins[p->n++] = ins; }

/* The decision for call numbers in runs [lo, hi] of the same action: a binary search on the
   number (jge to the upper half), so a call meets about eight comparisons, not one per entry. */
static void emit_tree(struct program *p, const int *starts, const unsigned *actions, int lo, int hi) {
    if (lo == hi) {
        emit(p, (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, actions[lo]));
        return;
    }
    int mid = (lo + hi + 1) / 2;
    emit(p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, (__u32)starts[mid], 0, 1));
    size_t jump = p->n;
    emit(p, (struct sock_filter)BPF_STMT(BPF_JMP | BPF_JA, 0));  /* to the upper half: patched below */
    emit_tree(p, starts, actions, lo, mid - 1);
    p->ins[jump].k = (__u32)(p->n - jump - 1);
    emit_tree(p, starts, actions, mid, hi);
}

/* The filter: harmless and unkeyed calls go on, a few ioctl and fcntl requests too, and every
   other call, of any number or ABI, goes to the supervisor. */
static int build_filter(struct program *p) {
    p->n = 0;
    emit(p, (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)));
    emit(p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, ARCH, 1, 0));
    emit(p, (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, NOTIFY));
    emit(p, (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)));
    /* x32's calls come with this ABI's arch and their own numbers, from 0x40000000 */
    emit(p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, 0x40000000u, 0, 1));
    emit(p, (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, NOTIFY));
    /* ioctl: the descriptor's own requests go on */
    size_t n_ioctl = sizeof OWN_IOCTLS / sizeof OWN_IOCTLS[0];
    emit(p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_ioctl, 0, (__u8)(n_ioctl + 3)));
    emit(p, (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[1])));
    for (size_t i = 0; i < n_ioctl; i++)
        emit(p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, OWN_IOCTLS[i], (__u8)(n_ioctl - i), 0));
    emit(p, (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, NOTIFY));
    emit(p, (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, ALLOW));
    /* fcntl: all but the questions about other processes' locks */
    size_t n_fcntl = sizeof OTHERS_FCNTLS / sizeof OTHERS_FCNTLS[0];
    emit(p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_fcntl, 0, (__u8)(n_fcntl + 3)));
    emit(p, (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[1])));
    for (size_t i = 0; i < n_fcntl; i++)
        emit(p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, OTHERS_FCNTLS[i], (__u8)(n_fcntl - i), 0));
    emit(p, (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, ALLOW));
    emit(p, (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, NOTIFY));
    /* sendto without an address: on a socket whose connect was judged, or a pair of its own */
    emit(p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_sendto, 0, 6));
    emit(p, (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[4])));
    emit(p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0, 0, 3));
    emit(p, (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[4]) + 4));
    emit(p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0, 0, 1));
    emit(p, (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, ALLOW));
    emit(p, (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, NOTIFY));
    /* sendmsg on the channel: the listener on its way to this supervisor (others are judged by
       the supervisor, which reads whether the message names an address) */
    emit(p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_sendmsg, 0, 4));
    emit(p, (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[0])));
    emit(p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (__u32)channel, 0, 1));
    emit(p, (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, ALLOW));
    emit(p, (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, NOTIFY));
    /* the rest by number: runs of numbers with one action */
    static int starts[MAXNR + 1];
    static unsigned actions[MAXNR + 1];
    int runs = 0;
    for (int nr = 0; nr < MAXNR; nr++) {
        const struct call *k = BY_NR[nr];
        unsigned action = k && (k->kind == HARMLESS || k->kind == UNKEYED) ? ALLOW : NOTIFY;
        if (!runs || actions[runs - 1] != action) { starts[runs] = nr; actions[runs++] = action; }
    }
    if (actions[runs - 1] != NOTIFY) { starts[runs] = MAXNR; actions[runs++] = NOTIFY; }
    emit_tree(p, starts, actions, 0, runs - 1);
    return p->n < MAXPROG ? 0 : -1;
}

static int install_filter(void) {
    static struct program p;
    if (build_filter(&p)) { errno = E2BIG; return -1; }
    struct sock_fprog fprog = {(unsigned short)p.n, p.ins};
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

/* The CPU set every process of the command is told: CPU 0 alone, on every machine and under any
   `configure --cpus`. A tool that sizes its work by it (nproc, LLVM's thread pools, -flto=auto)
   does the same work everywhere, so nothing about this machine's CPUs reaches an object through
   it; the kernel still schedules the process on the CPUs it really has. Returns the errno. */
static int answer_cpu_set(pid_t pid, const uint64_t *args, long long *value) {
    uint64_t len = args[1], mask[1] = {1};
    if (len < sizeof mask || len % sizeof(long)) return EINVAL;
    struct iovec local = {mask, sizeof mask}, remote = {(void *)args[2], sizeof mask};
    if (process_vm_writev(pid, &local, 1, &remote, 1, 0) != (ssize_t)sizeof mask) return EFAULT;
    *value = sizeof mask;
    return 0;
}

static void print_table(void) {
    for (size_t i = 0; i < NCALLS; i++)
        printf("%d\t%s\t%s\n", CALLS[i].nr, CALLS[i].name, KIND_NAMES[CALLS[i].kind]);
}

/* What the supervisor does with one call: 0 to let it go on, 1 when it answered it (value/error). */
static int handle(const struct seccomp_notif *req, int listener, long long *value, int *error) {
    struct seen c = {.pid = (pid_t)req->pid};
    const uint64_t *args = (const uint64_t *)req->data.args;
    if (req->data.arch != ARCH) {
        char detail[48];
        snprintf(detail, sizeof detail, "call %d of another ABI", req->data.nr);
        unstorable(c.pid, "foreign-abi", detail);
        return 0;
    }
    read_call(&c, &req->data);
    const struct call *k = c.call;
    if (!k) {
        char name[32];
        snprintf(name, sizeof name, "syscall-%d", req->data.nr);
        unstorable(c.pid, name, NULL);
        return 0;
    }
    switch (k->kind) {
    case ANSWERED:
        *error = answer_cpu_set(c.pid, args, value);
        return 1;
    case IOCTL: {
        char *target = folder_of(c.pid, (long)(int)args[0]);
        char detail[PATH_MAX + 64];
        /* The NVIDIA driver's devices, which nvcc's -arch=native asks: what it learns there is
           keyed by nvcc's dry run (pp4/reuse/nativecpu.py). */
        if (!target || strncmp(target, "/dev/nvidia", 11)) {
            snprintf(detail, sizeof detail, "request 0x%x on %s", (unsigned)args[1], target ? target : "?");
            unstorable(c.pid, "ioctl", detail);
        }
        free(target);
        return 0;
    }
    case FCNTL: {
        char detail[64];
        snprintf(detail, sizeof detail, "command %u (another process's lock or lease)", (unsigned)args[1]);
        unstorable(c.pid, "fcntl", detail);
        return 0;
    }
    case SEND: {
        /* sendto with an address (the filter let the others through), or sendmsg: one whose
           message names an address gives the socket a peer of its own choosing */
        struct msghdr msg;
        if (k->nr == SYS_sendmsg && read_memory(c.pid, args[1], &msg, sizeof msg) == 0 && !msg.msg_name) return 0;
        unstorable(c.pid, k->name, "a message sent to an address");
        return 0;
    }
    case SOCKET: {
        char detail[64];
        char *path = socket_path(c.pid, args[1], (size_t)args[2], detail, sizeof detail);
        struct stat st;
        if (path && lstat(path, &st) && (errno == ENOENT || errno == ENOTDIR)) {
            c.path = path;  /* nothing there: the connect fails, an absence like any other */
            break;
        }
        if (path) snprintf(detail, sizeof detail, "a Unix socket that is there");
        unstorable(c.pid, k->name, path ? path : detail);
        free(path);
        return 0;
    }
    case HARMLESS: case UNKEYED: case UNSTORABLE:
        unstorable(c.pid, k->name, NULL);
        return 0;
    default:
        break;
    }
    /* The GPU driver's files are logged for every process that asks (pp4 keys what nvcc learns
       there, and nothing another program learns): not once per path. */
    int per_process = c.path && (!strncmp(c.path, "/dev/nvidia", 11) || !strncmp(c.path, "/proc/driver/nvidia", 19));
    char *key = per_process ? NULL : seen_key(k->name, c.flags, c.path, c.path2);
    if (k->kind == SOCKET) {
        write_call(&c, ENOENT);
        free(key);
        free(c.path);
        return 0;
    }
    if (key && seen_before(key)) {
        free(key);  /* logged once with something there: the log's reader keeps that answer */
    } else if (c.path && !c.path[0] && strchr(c.flags, 'e')) {
        free(key);  /* the stat of an open file: its open was logged */
    } else {
        int found = look(&c);
        /* The thread may have died and its id gone to another since: then nothing read holds. */
        if (ioctl(listener, SECCOMP_IOCTL_NOTIF_ID_VALID, &req->id) == 0) {
            write_call(&c, found);
            if (k->kind == EXEC && found == 0) write_exec(c.pid, k, args);
            if (key && found == 0) remember_seen(key), key = NULL;
        }
        free(key);
    }
    free(c.path);
    free(c.path2);
    return 0;
}

int main(int argc, char **argv) {
    for (size_t i = 0; i < NCALLS; i++) BY_NR[CALLS[i].nr] = &CALLS[i];
    if (argc == 2 && !strcmp(argv[1], "--table")) {
        print_table();
        return 0;
    }
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
    channel = pair[1];
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
        long long value = 0;
        int error = 0;
        int answered = handle(req, listener, &value, &error);
        memset(resp, 0, sizes.seccomp_notif_resp);
        resp->id = req->id;
        if (answered) {
            resp->val = error ? -1 : value;
            resp->error = error ? -error : 0;
        } else {
            resp->flags = SECCOMP_USER_NOTIF_FLAG_CONTINUE;
        }
        ioctl(listener, SECCOMP_IOCTL_NOTIF_SEND, resp);  /* ENOENT: the caller is gone */
    }
    waitpid(child, &status, 0);
    fflush(out);
    if (ferror(out) || fclose(out)) { fprintf(stderr, "pp4-observe: cannot write %s\n", argv[1]); return 125; }
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}
