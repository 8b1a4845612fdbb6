"""What a compile edge of build.ninja starts: hand the edge to the build's compile server
(pp4/reuse/server.py), which forks a process with pp4's modules already loaded, instead of starting
Python and loading them for every compile; else run `python -m pp4.reuse` here, as before.

    python -S -I client.py CONFIG [--env NAME=VALUE]... -- COMPILER ARGS...

Run with -S -I and only built-in modules (and pp4/ninjarun.py, which imports nothing more), so it
starts in a few milliseconds. The process it hands
over to gets this process's standard streams, folder, environment and umask, and runs in the
same ninja run; this process stays until it ends, passes on the signals ninja sends (Ctrl-C) and
ends the same way. The run's prepass starts the server; an edge that finds none starts one in the
background and runs itself. PP4_NO_SERVER=1 turns the server off.
"""

import _socket
import marshal
import os
import signal
import sys

# pp4's folder, for its one module without imports of its own: the client runs with -I, which
# leaves it off sys.path.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from pp4 import ninjarun  # noqa: E402

PROTOCOL = 1
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
_SO_PEERCRED = 17


def server_name(config, run):
    """The abstract socket name of the compile server for CONFIG (as it is now), this Python, this
    environment and folder, and this ninja run: a server started by another run, or before configure
    rewrote the build, is never used."""
    st = os.stat(config)
    scope = repr((os.path.abspath(config), st.st_ino, st.st_mtime_ns, st.st_size, sys.executable, os.getcwd(),
                  sorted(os.environ.items()), run, os.getuid())).encode(errors="surrogateescape")
    import zlib  # a built-in extension module: no site needed

    return f"\0pp4-reuse-{os.getuid()}-{zlib.crc32(scope):08x}-{zlib.adler32(scope):08x}"


def run_here(argv):
    """Become `python -m pp4.reuse ARGV`, the edge without a server."""
    os.execv(sys.executable, [sys.executable, "-m", "pp4.reuse", *argv])


def start_server(name, run):
    """The server in the background, in its own session, with nothing of ninja's pipes: ninja waits
    for the edge's output to close, never for the server. One that cannot serve here (its modules do
    not load, no pidfds) still takes the name and answers each edge "no" until idle."""
    null = os.devnull
    try:
        os.posix_spawn(sys.executable, [sys.executable, "-m", "pp4.reuse.server", name.lstrip("\0"), run],
                       dict(os.environ), setsid=True,
                       file_actions=[(os.POSIX_SPAWN_OPEN, 0, null, os.O_RDONLY, 0),
                                     (os.POSIX_SPAWN_OPEN, 1, null, os.O_WRONLY, 0),
                                     (os.POSIX_SPAWN_DUP2, 1, 2)])
    except OSError:
        pass


def start_for(config):
    """Start the compile server of this ninja run for CONFIG unless one runs: the prepass does, so
    that every compile edge of the run finds it (the prepass runs before them all). Returns its
    name, for ready(), or None."""
    run = ninjarun.run_id()
    if os.environ.get("PP4_NO_SERVER") or not run:
        return None
    name = server_name(config, run)
    if not _listening(name):
        start_server(name, run)
    return name


def ready(name, timeout_s=3.0):
    """Wait until the server NAME listens (it binds its name first thing), at most timeout_s."""
    import time

    deadline = time.monotonic() + timeout_s
    while not _listening(name) and time.monotonic() < deadline:
        time.sleep(0.01)


def _connect(name):
    """A socket connected to the server NAME, or None where nothing listens there."""
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_SEQPACKET | _socket.SOCK_CLOEXEC)
    try:
        sock.connect(name)
        return sock
    except OSError:
        sock.close()
        return None


def _listening(name):
    sock = _connect(name)
    if sock is not None:
        sock.close()
    return sock is not None


def hand_over(sock, argv):
    """Send the edge with fds 0-2; returns the worker's pid, or None where the server did not take it."""
    request = marshal.dumps((PROTOCOL, list(argv), os.getcwd(), dict(os.environ), _umask(), os.getppid()))
    fds = b"".join(fd.to_bytes(4, sys.byteorder, signed=True) for fd in (0, 1, 2))
    sock.sendmsg([request], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, fds)])
    reply = sock.recv(64)
    if not reply.startswith(b"P"):
        return None
    return int(reply[1:])


def _umask():
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def wait_for(sock, pid):
    """Pass signals on to the worker's process group until it ends; end as it did."""
    def forward(signum, frame):
        try:
            os.killpg(pid, signum)
        except OSError:
            pass

    for sig in FORWARDED:
        signal.signal(sig, forward)
    sock.settimeout(None)
    sock.send(b"G")
    reply = sock.recv(64)
    if reply.startswith(b"E"):
        sys.stdout.flush()
        os._exit(int(reply[1:]))
    if reply.startswith(b"S"):
        sig = int(reply[1:])
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)
    # The server ended without the worker's status: end the worker too, and say so.
    forward(signal.SIGKILL, None)
    print(f"pp4: the build's compile server ended while it ran this edge (pid {pid}); run ninja again, "
          "or set PP4_NO_SERVER=1 to compile without it", file=sys.stderr)
    os._exit(1)


def main(argv):
    if os.environ.get("PP4_NO_SERVER") or not argv:
        run_here(argv)
    run = ninjarun.run_id()
    try:
        name = server_name(argv[0], run) if run else None
    except OSError:
        name = None
    if name is None:  # not under ninja, or no config: nothing to share a server with
        run_here(argv)
    sock = _connect(name)
    if sock is None:
        start_server(name, run)
        run_here(argv)
    try:
        sock.settimeout(10)
        uid = int.from_bytes(sock.getsockopt(_socket.SOL_SOCKET, _SO_PEERCRED, 12)[4:8], sys.byteorder)
        pid = hand_over(sock, argv) if uid == os.getuid() else None
    except (OSError, ValueError):
        pid = None
    if pid is None:  # another user's socket by that name, a full server, a protocol it does not speak
        sock.close()
        run_here(argv)
    wait_for(sock, pid)


if __name__ == "__main__":
    main(sys.argv[1:])
