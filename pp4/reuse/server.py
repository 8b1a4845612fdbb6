"""The build's compile server: one process per ninja run, with pp4's modules loaded once, that forks
a worker for each compile edge handed to it (pp4/reuse/client.py). A worker is the edge as
`python -m pp4.reuse` would run it: the client's standard streams, folder, environment and umask,
its own process group (the client passes on ninja's signals to it), the same ninja run; only the
Python start-up and the imports are gone.

    python -m pp4.reuse.server NAME RUN     (started by the run's prepass, or by an edge that finds none)

It listens on an abstract Unix socket, named after the build's config, Python, environment, folder
and ninja run (client.server_name), and serves only its own user. It ends when its ninja run
has ended and its workers with it, or when idle for long. A client whose edge cannot be
handed over (no server, another user's socket, an old protocol) runs the edge itself.
"""

from __future__ import annotations

import gc
import importlib
import marshal
import os
import selectors
import signal
import socket
import struct
import sys
import time

from pp4.reuse import client

# With no edge for this long the server ends (the next edge starts another). It lives as long as
# its ninja run where it can watch it: a run's edges may start minutes apart.
IDLE_S = 600.0
IDLE_UNWATCHED_S = 30.0
_MAX_REQUEST = 4 << 20


def preload() -> None:
    """What a compile edge imports, loaded once here for every worker."""
    for name in ("pp4.reuse.__main__", "pp4.execution.run", "pp4.report.progress"):
        importlib.import_module(name)


class Worker:
    def __init__(self, pid: int, conn: socket.socket, go: int):
        self.pid, self.conn, self.go = pid, conn, go
        self.pidfd = os.pidfd_open(pid)
        self.started = False


def serve(listener: socket.socket, run: str) -> int:
    ninja = _pidfd_of_run(run)
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ, "accept")
    if ninja is not None:
        sel.register(ninja, selectors.EVENT_READ, "ninja")
    gc.freeze()  # what is loaded now stays shared with every worker, never copied by a collection
    workers: dict[int, Worker] = {}
    idle_since, ninja_gone = time.monotonic(), False
    while True:
        for key, _ in sel.select(timeout=1.0):
            what = key.data
            if what == "accept":
                worker = _accept(listener)
                if worker is not None:
                    workers[worker.pid] = worker
                    sel.register(worker.conn, selectors.EVENT_READ, ("conn", worker.pid))
                    sel.register(worker.pidfd, selectors.EVENT_READ, ("exit", worker.pid))
            elif what == "ninja":
                sel.unregister(ninja)
                ninja_gone = True
                sel.unregister(listener)
                listener.close()  # no new edges of a run that has ended
            elif what[0] == "conn":
                worker = workers[what[1]]
                data = _recv(worker.conn)
                if data == b"G" and not worker.started:
                    worker.started = True
                    os.write(worker.go, b"G")
                elif not data:
                    sel.unregister(worker.conn)
                    if worker.started:  # the client was killed: so is its edge, as a signal to its group would
                        _kill_group(worker.pid, signal.SIGKILL)
                    else:  # it gave up waiting and runs the edge itself: this worker ends unstarted
                        os.close(worker.go)
                        worker.go = -1
            elif what[0] == "exit":
                worker = workers.pop(what[1])
                _, status = os.waitpid(worker.pid, 0)
                sel.unregister(worker.pidfd)
                os.close(worker.pidfd)
                if worker.go != -1:
                    os.close(worker.go)
                reply = f"S{os.WTERMSIG(status)}" if os.WIFSIGNALED(status) else f"E{os.WEXITSTATUS(status)}"
                try:
                    worker.conn.send(reply.encode())
                except OSError:
                    pass
                if worker.conn.fileno() in sel.get_map():
                    sel.unregister(worker.conn)
                worker.conn.close()
                idle_since = time.monotonic()
        idle = IDLE_S if ninja is not None else IDLE_UNWATCHED_S
        if not workers and (ninja_gone or time.monotonic() - idle_since > idle):
            return 0


def _recv(conn: socket.socket) -> bytes:
    try:
        return conn.recv(16)
    except OSError:
        return b""


def _kill_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except OSError:
        pass


def _pidfd_of_run(run: str) -> int | None:
    """A pidfd of the run's ninja, if it is still the process that started the run."""
    try:
        fd = os.pidfd_open(int(run.partition("-")[0]))
    except (OSError, ValueError):
        return None
    from pp4 import ninjarun

    if not ninjarun.is_running(run):  # its pid is another process's now
        os.close(fd)
        return None
    return fd


def _accept(listener: socket.socket) -> Worker | None:
    conn, _ = listener.accept()
    conn.settimeout(10)
    try:
        _, uid, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
        if uid != os.getuid():
            raise OSError("another user")
        data, ancdata, _, _ = conn.recvmsg(_MAX_REQUEST, socket.CMSG_LEN(3 * 4))
        fds = [fd for level, kind, payload in ancdata if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS
               for fd in struct.unpack(f"{len(payload) // 4}i", payload[:len(payload) // 4 * 4])]
    except OSError:
        conn.close()
        return None
    try:
        request = marshal.loads(data)
        ok = request[0] == client.PROTOCOL and len(fds) == 3
    except (ValueError, EOFError, TypeError, IndexError):
        ok = False
    if not ok:
        for fd in fds:
            os.close(fd)
        conn.close()
        return None
    go_read, go_write = os.pipe()
    sys.stdout.flush(), sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        try:
            os.setpgid(0, 0)
            os.close(go_write)
            _work(go_read, fds, request)
        except BaseException:  # in setting up the edge, before pp4.reuse's own handling: say so on its stderr
            import traceback

            os.write(2, ("pp4: the compile server could not run this edge (PP4_NO_SERVER=1 runs it without):\n"
                         + traceback.format_exc()).encode(errors="backslashreplace"))
        finally:
            os._exit(1)
    try:
        os.setpgid(pid, pid)  # both sides set it: the client may signal the group as soon as it has the pid
    except OSError:
        pass
    os.close(go_read)
    for fd in fds:
        os.close(fd)
    try:
        conn.send(f"P{pid}".encode())
    except OSError:
        pass
    conn.settimeout(None)
    return Worker(pid, conn, go_write)


def _work(go: int, fds: list[int], request: tuple) -> None:
    """The worker: wait for the client's go, become its edge, run it, end with its status."""
    _, argv, cwd, env, umask, client_parent = request
    if os.read(go, 1) != b"G":  # the client gave up before the edge started
        os._exit(0)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    os.closerange(3, 1 << 20)  # the listener, other clients' connections, the pipes: none is this edge's
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.chdir(cwd)
    os.umask(umask)
    os.environ.clear()
    os.environ.update(env)
    # The process's own streams, as Python makes them: stderr line-buffered, never closed.
    sys.stdin = open(0, "r", closefd=False)  # noqa: SIM115
    sys.stdout = open(1, "w", closefd=False, encoding=sys.stdout.encoding)  # noqa: SIM115
    sys.stderr = open(2, "w", buffering=1, closefd=False, encoding=sys.stderr.encoding,  # noqa: SIM115
                      errors="backslashreplace")
    sys.argv = ["pp4.reuse", *argv]
    from pp4 import ninjarun
    from pp4.reuse.__main__ import main

    ninjarun.ANCESTORS_FROM = client_parent  # the ninja run is the client's, not this server's
    try:
        code = main(list(argv))
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    sys.stdout.flush(), sys.stderr.flush()
    os._exit(code or 0)


def refuse(listener: socket.socket, why: str) -> int:
    """Answer every edge "no" (it runs itself) until idle: one failed start per run, not one per edge."""
    listener.settimeout(IDLE_UNWATCHED_S)
    while True:
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            return 1
        with conn:
            try:
                conn.send(b"N" + why.encode()[:200])
            except OSError:
                pass


def main(argv: list[str]) -> int:
    name, run = argv
    os.chdir("/")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    try:
        listener.bind("\0" + name)
    except OSError:  # another client of this run started one first
        return 0
    listener.listen(64)
    try:
        preload()
        if not hasattr(os, "pidfd_open"):
            raise OSError("os.pidfd_open is missing (Python 3.9 or later on Linux 5.3 or later)")
    except Exception as e:  # noqa: BLE001: whatever it is, edges run without a server
        return refuse(listener, f"{type(e).__name__}: {e}")
    return serve(listener, run)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
