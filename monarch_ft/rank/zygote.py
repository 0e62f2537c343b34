"""The fork server (a "zygote") and the rank each fork becomes: the rank side of warm fork.

The controller's fork pool (:mod:`monarch_ft.controller.fork_pool`) starts one of these per
host, ``python -m monarch_ft.rank.zygote FD RUN_DIR [MODULE ...]``; it imports the modules a
rank needs (torch, TorchTitan, TorchFT, the trainer) once and then waits on the socket ``FD``
for fork requests (:mod:`monarch_ft.records.fork_wire`). Each fork becomes exactly what
``python -m monarch_ft.rank.worker SPEC`` runs, minus the imports. ``RUN_DIR`` names the run
in its command line, as a rank's spec path does, and leaves room for a forked rank to write
its own command line over it (:func:`set_cmdline`).

Fork safety, which is why the server does *nothing* but import: ``fork()`` copies only the
calling thread. A lock held by another thread at that instant (an OpenMP or intra-op pool,
a gloo or TorchFT runtime thread, the CUDA driver's) stays locked forever in the child, and
a CUDA context cannot be used across a fork at all. So the server imports modules and runs
no torch op, starts no thread pool, opens no process group, never touches CUDA and never
constructs a TorchFT ``Manager`` (which would heartbeat the Lighthouse as a replica that
never joins a quorum). Before every fork it checks that it is still single-threaded and
that CUDA is not initialised, and refuses otherwise (the relaunch then starts cold).
Environment read at import time (``OMP_NUM_THREADS`` by libgomp when torch loads it) is
the ranks' own: the server is started with the ranks' environment, and the child applies
its launch's environment to ``os.environ`` before the worker reads anything. Two native
pools start at import all the same, and are dealt with: numpy's OpenBLAS (sized from the
environment: the pool starts the server with ``OPENBLAS_NUM_THREADS=1`` unless the ranks'
environment sizes it) and pyarrow's jemalloc purger (:data:`FORK_SAFE_THREADS`).

The child becomes the rank the local launcher would start: its own session (a Ctrl-C in the
terminal reaches the controller only), the launch's cwd, environment and log file on
stdout/stderr, stdin from /dev/null, and the launcher's life rule: training ranks outlive
the controller, while the server itself dies with it (``PR_SET_PDEATHSIG``); a launch marked
to die with its controller gets that on the server. Being the server's child, not the
controller's, its exit status comes back through the server, which reaps it on ``SIGCHLD``
and reports ``exited`` with the code.
"""

from __future__ import annotations

import importlib
import os
import selectors
import signal
import socket
import sys
import threading
import time
import traceback
from typing import Iterable, Optional

from monarch_ft.common import proctitle
from monarch_ft.common.cpu_priority import may_raise_priority, to_background, to_foreground
from monarch_ft.records.fork_wire import FORK_NICE_ENV, ForkOp, ProtocolError, decode, encode
from monarch_ft.records.launch import WORKER_MODULE, ZYGOTE_MODULE, worker_spec

# Native threads a fork is safe with. jemalloc (pyarrow's allocator, loaded through
# TorchTitan's datasets import) starts a background purging thread at load; jemalloc takes
# every lock of its own in a pthread_atfork handler before the fork and re-initialises them
# and its background threads in the child, so the child's allocator is consistent.
FORK_SAFE_THREADS = frozenset({"jemalloc_bg_thd"})


def fork_unsafe(threads: list[str], cuda_initialized: bool) -> Optional[str]:
    """Why forking now would hand the child a broken runtime, or None (see the module docstring).

    Args:
        threads: the names of every thread but the main one.
        cuda_initialized: ``torch.cuda.is_initialized()``.
    """
    unsafe = sorted(t for t in threads if t not in FORK_SAFE_THREADS)
    if unsafe:
        return f"the fork server runs other threads ({', '.join(unsafe)}): a fork copies only one, their locks would stay held"
    if cuda_initialized:
        return "CUDA is initialised in the fork server (a CUDA context does not survive a fork)"
    return None


def other_threads() -> list[str]:
    """Names of this process's threads other than the main one, native ones included."""
    names = []
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return [t.name for t in threading.enumerate() if t is not threading.main_thread()]
    for tid in tids:
        if int(tid) == os.getpid():
            continue
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                names.append(f.read().strip())
        except OSError:
            pass  # it ended meanwhile
    return names


def import_niceness(asked: Optional[str], may_raise: bool) -> int:
    """The niceness the server imports at: what the pool asked (``MONARCH_FT_FORK_NICE``), only
    where it may take priority 0 back once ready (else its forks would train niced).

    Args:
        asked: the environment variable's value (None: not set).
        may_raise: the process holds CAP_SYS_NICE (common.cpu_priority.may_raise_priority).
    """
    try:
        n = int(asked or 0)
    except ValueError:
        return 0
    return n if n > 0 and may_raise else 0


def serve(fd: int, preload: Iterable[str] = (), niceness: int = 0) -> int:
    """The fork server's main loop, on the socket ``fd`` (a socketpair end from the controller),
    after importing ``preload`` (the controller's fork pool passes its ``PRELOAD`` and the model
    package) at ``niceness`` (:func:`import_niceness`), back at 0 before it forks anything."""
    sock = socket.socket(fileno=fd)
    started = time.time()
    if niceness:
        to_background(niceness)  # single-threaded still: the threads started by the imports inherit it
    for name in preload:
        importlib.import_module(name)
    error = to_foreground() if niceness else None
    if error is not None:
        # Checked before nicing (may_raise_priority), so not expected; but never fork ranks that would train niced.
        print(f"[forkserver {os.getpid()}] cannot take priority 0 back after importing at {niceness}: {error}", file=sys.stderr, flush=True)
        return 3
    sys.stdout.flush()
    sys.stderr.flush()
    rpipe, wpipe = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wpipe)
    # A handler (not SIG_IGN: then the kernel would reap the children, status lost): its
    # only job is the wake-up byte; the loop reaps.
    signal.signal(signal.SIGCHLD, lambda *_: None)
    sel = selectors.DefaultSelector()
    sel.register(sock, selectors.EVENT_READ)
    sel.register(rpipe, selectors.EVENT_READ)
    children: dict[int, int] = {}  # pid -> request id
    sock.sendall(encode(ForkOp.READY, pid=os.getpid(), import_s=round(time.time() - started, 3), threads=other_threads(), import_niceness=niceness))
    print(f"[forkserver {os.getpid()}] ready: imported in {time.time() - started:.2f}s, other threads: {other_threads()}", flush=True)
    buf = b""
    inherited = (fd, rpipe, wpipe)
    while True:
        for key, _ in sel.select(timeout=1.0):
            if key.fd == rpipe:
                try:
                    os.read(rpipe, 4096)
                except BlockingIOError:
                    pass
                continue
            data = sock.recv(65536)
            if not data:
                # The controller closed the channel (or died): the server's work is over. Its
                # children live on (or die by their own PDEATHSIG), adopted by init.
                return 0
            buf += data
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                try:
                    msg = decode(line)
                except ProtocolError as e:
                    print(f"[forkserver] ignored: {e}", file=sys.stderr, flush=True)
                    continue
                if msg["op"] is not ForkOp.FORK:
                    print(f"[forkserver] ignored {msg['op']}", file=sys.stderr, flush=True)
                    continue
                reply = _fork(msg, inherited, sel)
                if reply["op"] is ForkOp.FORKED:
                    children[reply["pid"]] = msg["id"]
                sock.sendall(encode(**reply))
        _reap(children, sock)


def _reap(children: dict[int, int], sock: socket.socket) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        rid = children.pop(pid, None)
        sock.sendall(encode(ForkOp.EXITED, id=rid, pid=pid, code=os.waitstatus_to_exitcode(status)))


def _fork(msg: dict, inherited: tuple[int, ...], sel: selectors.BaseSelector) -> dict:
    spec = worker_spec(msg["argv"])
    if spec is None:
        return {"op": ForkOp.REFUSED, "id": msg["id"], "error": f"not a rank launch: {msg['argv'][:4]}"}
    torch = sys.modules.get("torch")
    unsafe = fork_unsafe(other_threads(), torch is not None and torch.cuda.is_initialized())
    if unsafe:
        return {"op": ForkOp.REFUSED, "id": msg["id"], "error": unsafe}
    server = os.getpid()
    try:
        pid = os.fork()
    except OSError as e:
        return {"op": ForkOp.REFUSED, "id": msg["id"], "error": f"fork: {e}"}
    if pid == 0:
        _become_rank(msg, spec, server, inherited, sel)  # never returns
    return {"op": ForkOp.FORKED, "id": msg["id"], "pid": pid}


def set_cmdline(argv: list[str]) -> bool:
    """Make ``/proc/self/cmdline`` read ``argv``, and the process's name its program's (what ps,
    top, psutil and the run's own leak checks match a rank by, until the rank titles itself:
    monarch_ft.common.proctitle). As setproctitle does: over the original argv memory, which CPython
    copied at start-up, the new line, a NUL, and padding with a non-NUL last byte (the kernel
    then reads up to that NUL). A line longer than the original is cut. False where it cannot."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end (stat fields 48, 49)
        size = end - start
        if size < 2:
            return False
        title = " ".join(argv).encode()[: size - 2]
        with open("/proc/self/mem", "r+b", buffering=0) as mem:
            mem.seek(start)
            mem.write(title + b"\0" + b" " * (size - len(title) - 1))
        with open("/proc/self/comm", "w") as comm:  # the kernel's name too (top), not the server's title
            comm.write(os.path.basename(argv[0])[:15])
        return True
    except (OSError, IndexError, ValueError):
        return False


def _become_rank(msg: dict, spec: str, server: int, inherited: tuple[int, ...], sel: selectors.BaseSelector) -> None:
    """In the child: become ``python -m monarch_ft.rank.worker SPEC`` as the local launcher starts it."""
    code = 1
    try:
        # The server's own plumbing: a child holding the channel would hide the server's death.
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        sel.close()
        for fd in inherited:
            try:
                os.close(fd)
            except OSError:
                pass
        os.setsid()  # its own session, as start_new_session=True
        if msg["niceness"]:  # a standby builds below the training ranks, as the local launcher starts one
            to_background(msg["niceness"])
        set_cmdline(msg["argv"])  # it reads as the rank it becomes, not as the server
        if msg["die_with_parent"]:
            from monarch_ft.common.process import die_with_parent

            die_with_parent()
            if os.getppid() != server:  # the server died before the line above
                os._exit(1)
        os.chdir(msg["cwd"])
        os.environ.clear()
        os.environ.update(msg["env"])
        os.makedirs(os.path.dirname(msg["log_path"]) or ".", exist_ok=True)
        log = os.open(msg["log_path"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        os.close(null)
        if msg.get("netns"):
            # Forked by the server of another simulated host (a standby on a host of its own):
            # into its own host as `ip netns exec` puts a cold one there (network, hosts file,
            # host name). Single-threaded here, as unshare needs; before any socket is opened.
            from monarch_ft.launcher.hosts import enter_host

            enter_host(msg["netns"], msg["netns"])()
        worker = importlib.import_module(WORKER_MODULE)
        sys.argv = [worker.__file__, spec]
        code = worker.main([spec])
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code if isinstance(code, int) else 1)


def main(argv: list[str]) -> int:
    if len(argv) < 2 or not argv[0].isdigit():
        print(f"usage: python -m {ZYGOTE_MODULE} FD RUN_DIR [MODULE ...]", file=sys.stderr)
        return 2
    proctitle.set_title(argv[1], proctitle.FORK_SERVER)  # a forked rank retitles itself (monarch_ft.rank.worker)
    code = serve(int(argv[0]), argv[2:], import_niceness(os.environ.get(FORK_NICE_ENV), may_raise_priority()))
    sys.stdout.flush()
    # Nothing to finalise, and tearing down torch's modules only costs time.
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
