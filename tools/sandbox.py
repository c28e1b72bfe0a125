"""The sandboxed Python tool (`tools: [python]`): the model's code runs in a fresh interpreter, in a scratch
directory removed afterwards, with limits.

What holds, from the outside in:

- **time**: `wall_s` of wall-clock time (the whole process group is killed), `cpu_s` of CPU time (RLIMIT_CPU);
- **memory**: `memory_mb` of address space (RLIMIT_AS): an allocation past it raises MemoryError in the code;
- **processes**: the code may not start any (Python's audit events for fork, exec, spawn, subprocess and
  os.system are refused), and as a second line RLIMIT_NPROC caps the tasks of the user it runs as;
- **files**: the code reads and writes inside its scratch directory only; it may read Python's own library
  folders (so `import numpy` works) and nothing else (audit events for open, listdir, scandir, remove, rename,
  chdir, ... are checked); files it writes are capped at `file_mb` (RLIMIT_FSIZE), as is its output;
- **network**: the process gets a network namespace of its own with no interface but loopback (`unshare`,
  as root or through an unprivileged user namespace); where the kernel allows neither, socket audit events
  are refused instead (a weaker limit: code that reaches the C library directly is not stopped), and the
  tool's description says so;
- **user**: run by root, the code runs as `nobody` (when Python's own folders are readable to others, so that
  its imports still work; a Python installed under /root is not), so the files only root may read stay closed
  even to native code.

ctypes is refused too (its audit events), since native calls would step around the audit hooks. This is a
guard for model-written code during RL, the threat model of veRL's and TRL's code tools; it is not a security
boundary for hostile code (run that in a container or a remote sandbox, e.g. behind an MCP server).

Settings (the entry's keys): cpu_s (5), wall_s (8; keep the entry's timeout_s, default 10, above it), memory_mb
(1024), file_mb (16), processes (16: RLIMIT_NPROC's headroom over the tasks the user already runs).

A run that ends, however it ends, is a result: its output (stdout then stderr, cut at the entry's `max_chars`)
and, when it failed, its exit status. A run past `cpu_s` or `wall_s` is a `timeout`; one killed for its output
or another signal, an `exception`.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile

from tools.function import ToolFailed

# Runs in the sandboxed interpreter: drop what it may not keep, install the audit hook, run the code.
BOOTSTRAP = r'''
import ctypes, json, os, resource, sys
cfg = json.loads(sys.argv[1])
isolation = "none"
try:                                                   # a network namespace of its own
    libc = ctypes.CDLL(None, use_errno=True)
    CLONE_NEWNET, CLONE_NEWUSER = 0x40000000, 0x10000000
    if libc.unshare(CLONE_NEWNET) == 0 or (os.getuid() != 0 and libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) == 0):
        isolation = "namespace"
except OSError:
    pass
if os.getuid() == 0 and cfg["user"] is not None:       # root: run as nobody
    os.setgroups([])
    os.setgid(cfg["user"][1])
    os.setuid(cfg["user"][0])
for name, value in (("RLIMIT_CPU", cfg["cpu_s"]), ("RLIMIT_AS", cfg["memory"]), ("RLIMIT_FSIZE", cfg["file"]),
                    ("RLIMIT_NPROC", cfg["nproc"]), ("RLIMIT_CORE", 0)):
    if value is not None:
        hard = value + 1 if name == "RLIMIT_CPU" else value
        resource.setrlimit(getattr(resource, name), (value, hard))
scratch = os.path.realpath(os.getcwd())
readable = tuple(os.path.realpath(p) for p in cfg["readable"]) + ("/dev/null", "/dev/urandom")

def inside(path, roots):
    try:
        p = os.path.realpath(os.fsdecode(path))
    except (TypeError, ValueError):
        return False
    return any(p == r or p.startswith(r.rstrip("/") + "/") for r in roots)

WRITE = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
PROCESS = {"os.system", "os.fork", "os.forkpty", "os.exec", "os.posix_spawn", "os.spawn", "subprocess.Popen",
           "os.kill", "os.killpg", "pty.spawn"}
PATHS = {"os.listdir": 0, "os.scandir": 0, "os.chdir": 0, "os.remove": 0, "os.rmdir": 0, "os.mkdir": 0,
         "os.rename": 0, "os.link": 0, "os.symlink": 0, "os.truncate": 0, "os.chmod": 0, "os.chown": 0,
         "os.utime": 0, "shutil.rmtree": 0, "shutil.copyfile": 0, "shutil.move": 0}
NET = cfg["network_events"]

def hook(event, args):
    if event == "open":
        path, mode, flags = args
        if path is None or isinstance(path, int):
            return
        write = any(c in (mode or "") for c in "wax+") or bool((flags or 0) & WRITE)
        if inside(path, (scratch,)) or (not write and inside(path, readable)):
            return
        raise PermissionError(f"the sandbox may not {'write' if write else 'read'} {os.fsdecode(path)!r}: only its "
                              f"working directory {scratch!r}")
    if event in PATHS:
        path = args[PATHS[event]] if args else "."
        if isinstance(path, int) or inside(path, (scratch,)) or (event in ("os.listdir", "os.scandir") and inside(path, readable)):
            return
        raise PermissionError(f"the sandbox may not touch {os.fsdecode(path)!r}: only its working directory")
    if event in PROCESS or event.startswith("os.exec"):
        raise PermissionError("the sandbox may not start processes")
    if event.startswith("ctypes."):
        raise PermissionError("the sandbox may not call native code (ctypes)")
    if NET and event.startswith("socket.") and event not in ("socket.__new__",):
        raise PermissionError("the sandbox has no network")

import traceback
code = sys.stdin.read()
sys.addaudithook(hook)
del ctypes, libc
sys.argv = ["<tool>"]
try:
    exec(compile(code, "<tool>", "exec"), {"__name__": "__main__"})
except SystemExit:
    raise
except BaseException as e:                             # the code's traceback, without the sandbox's frames
    shown = traceback.TracebackException.from_exception(e)
    shown.stack = traceback.StackSummary.from_list([f for f in shown.stack if f.filename != "<string>"])
    sys.stderr.write("".join(shown.format()))
    sys.exit(1)
'''


def _nobody() -> tuple[int, int] | None:
    try:
        import pwd

        entry = pwd.getpwnam("nobody")
        return entry.pw_uid, entry.pw_gid
    except (ImportError, KeyError):
        return None


def _tasks_of(uid: int) -> int:
    """Tasks (threads included) the user runs now: RLIMIT_NPROC counts them all."""
    count = 0
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if os.stat(f"/proc/{pid}").st_uid == uid:
                    count += len(os.listdir(f"/proc/{pid}/task"))
            except OSError:
                continue
    return count


def _open_to_others(paths: list[str]) -> bool:
    """Whether `nobody` could read each of `paths` (every folder on the way searchable by others, each path
    readable by others)."""
    import stat

    for path in paths:
        parts = os.path.realpath(path).split("/")
        for k in range(2, len(parts) + 1):
            folder = "/".join(parts[:k]) or "/"
            mode = os.stat(folder).st_mode
            need = stat.S_IXOTH | (stat.S_IROTH if k == len(parts) else 0)
            if mode & need != need:
                return False
    return True


def _readable() -> list[str]:
    """Python's own folders: the standard library and the installed packages (imports read them)."""
    paths = {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    paths |= {sys.base_prefix + "/lib", sys.prefix + "/lib"}
    return sorted(p for p in paths if os.path.isdir(p))


@functools.lru_cache(maxsize=1)
def has_network_namespace() -> bool:
    """Whether this machine gives the sandbox a network namespace (else socket events are refused instead);
    probed once per process."""
    probe = ("import ctypes, os; libc = ctypes.CDLL(None); "
             "ok = libc.unshare(0x40000000) == 0 or (os.getuid() != 0 and libc.unshare(0x50000000) == 0); "
             "raise SystemExit(0 if ok else 1)")
    try:
        return subprocess.run([sys.executable, "-I", "-c", probe], timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@functools.lru_cache(maxsize=1)
def _identity() -> tuple[list[str], tuple[int, int] | None]:
    """(Python's folders the code may read, the (uid, gid) it runs as or None for this process's), once per process."""
    readable = _readable()
    return readable, _nobody() if os.getuid() == 0 and _open_to_others(readable) else None


def run_code(code: str, *, cpu_s: float = 5, wall_s: float = 8, memory_mb: int = 1024, file_mb: int = 16,
             processes: int = 16) -> tuple[str, int]:
    """Run `code` in the sandbox (module docstring); returns (stdout + stderr, exit status).
    ToolFailed(timeout) past `cpu_s` or `wall_s`, ToolFailed(exception) when killed by another signal."""
    readable, user = _identity()
    uid = user[0] if user else os.getuid()
    scratch = tempfile.mkdtemp(prefix="mmrl-sandbox-")
    out_dir = tempfile.mkdtemp(prefix="mmrl-sandbox-out-")
    try:
        if user:
            os.chown(scratch, *user)
        cfg = {"cpu_s": max(1, int(cpu_s)), "memory": int(memory_mb) << 20, "file": int(file_mb) << 20,
               "nproc": _tasks_of(uid) + int(processes), "user": user, "readable": readable,
               "network_events": not has_network_namespace()}
        env = {"PATH": "/usr/bin:/bin", "HOME": scratch, "TMPDIR": scratch, "LANG": "C.UTF-8",
               "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}
        with open(os.path.join(out_dir, "out"), "wb") as out:
            proc = subprocess.Popen([sys.executable, "-I", "-c", BOOTSTRAP, json.dumps(cfg)], cwd=scratch, env=env,
                                    stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
            try:
                proc.communicate(code.encode(), timeout=wall_s)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                raise ToolFailed("timeout", f"the code ran past its {wall_s:g} s of wall time") from None
            finally:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)          # anything it left behind
                except ProcessLookupError:
                    pass
        with open(os.path.join(out_dir, "out"), "rb") as f:
            data = f.read(file_mb << 20)
        output = data.decode("utf-8", "replace")
        if len(data) >= file_mb << 20:
            output += f"\n[the output past {file_mb} MB was cut]"
        status = proc.returncode
        if status == -signal.SIGXCPU:
            raise ToolFailed("timeout", f"the code ran past its {cpu_s:g} s of CPU time")
        if status == -signal.SIGXFSZ:
            raise ToolFailed("exception", f"the code wrote past its {file_mb} MB of output or files")
        if status is not None and status < 0:
            name = signal.Signals(-status).name
            raise ToolFailed("exception", f"the code was killed by {name}" + (
                f" (past its {cpu_s:g} s of CPU time?)" if name == "SIGKILL" else ""))
        return output, status
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.rmtree(out_dir, ignore_errors=True)


def python(code: str, *, cpu_s: float = 5, wall_s: float = 8, memory_mb: int = 1024, file_mb: int = 16,
           processes: int = 16) -> str:
    """Run Python code and return what it prints (stdout, then stderr). Each call starts a fresh interpreter in an
    empty working directory, without network access; print what you need to see.

    Args:
        code: The Python program to run.
    """
    output, status = run_code(code, cpu_s=cpu_s, wall_s=wall_s, memory_mb=memory_mb, file_mb=file_mb,
                              processes=processes)
    return output if status == 0 else f"{output}\n[exit status {status}]".lstrip("\n")
