"""What runs inside the sandbox's fresh namespaces; started by ``sandbox.py``, never imported.

``sandbox.py`` launches ``unshare --net --mount --pid --fork python -I sandbox_boot.py CONFIG`` as root, or, not
root, with ``--user --map-root-user`` first (``cfg["userns"]``: then this script is root only inside its own user
namespace, which owns the other namespaces). This script then is process 1 of a new PID namespace, with its own
(empty, loopback-down) network namespace and a private copy of the mount table, so every mount below is invisible
to the host. Steps:

1. read the program while its host directory is still visible;
2. mount a fresh ``/proc`` (host processes become invisible) and size-limited tmpfs over the world-writable
   directories (``/tmp``...) and the secret-bearing homes (``/root``, ``/home``); re-expose read-only the
   Python installation when it lives under a hidden directory (e.g. pyenv in ``/root``); create the fresh
   working directory; remount every other host filesystem read-only;
3. fork the program's process: (in a user namespace: enter a nested one where only the leased uid exists, so the
   program holds no capability over the namespaces above) resource limits, drop to the leased unprivileged uid
   (no supplementary groups, no capabilities, no new privileges), cd into the working directory, run the grader's
   import prelude when the tests ask for it, then run the program (or call its function);
4. wait with a deadline on the program's own time (wall-clock time less its waits for a CPU, so a busy machine
   does not fail it; at most ``max_stretch`` times the limit in real time) and write a status line (a Python dict
   literal) for the host to classify, with the program's own time.

When this process exits, the kernel kills everything left in the PID namespace (daemons, fork-bomb leftovers).
"""

# Only cheap modules: this runs before every single test, and `json`/`signal`/`traceback` each cost 7-14 ms of
# imports (re, enum); the host passes the config with marshal and parses our status lines with ast.literal_eval.
import builtins
import ctypes
import marshal
import os
import resource
import select
import sys
import time
import types

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC = 1, 2, 4, 8, 32, 4096, 16384
# Per-mount options a read-only bind remount must restate, or the kernel would clear them.
MOUNT_OPTION_FLAGS = {
    "nosuid": MS_NOSUID,
    "nodev": MS_NODEV,
    "noexec": MS_NOEXEC,
    "noatime": 1024,
    "relatime": 1 << 21,
}
KERNEL_FILESYSTEMS = ("/proc", "/sys", "/dev")  # not world-writable; device nodes must stay usable
PR_SET_NO_NEW_PRIVS = 38
CLONE_NEWUSER = 0x10000000
LINUX_CAPABILITY_VERSION_3 = 0x20080522
WORLD_WRITABLE = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")
SECRET_HOMES = ("/root", "/home")
SMALL_TMPFS = 2**20

_libc = ctypes.CDLL(None, use_errno=True)


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    args = [s.encode() if s is not None else None for s in (source, target, fstype)]
    if _libc.mount(args[0], args[1], args[2], flags, data.encode() if data else None) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {source} on {target}: {os.strerror(err)}")


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _isolate_filesystem(cfg: dict) -> None:
    candidates = dict.fromkeys((*WORLD_WRITABLE, *SECRET_HOMES, *cfg["hide"]))  # hide: e.g. the user's $HOME
    hidden = [d for d in candidates if d != "/" and os.path.isdir(d) and not os.path.islink(d)]
    hidden = [d for d in hidden if not any(_under(d, other) for other in hidden if other != d)]
    # Open the interpreter's directories before hiding them: the fds survive the tmpfs mounts and are bound back.
    prefixes = {os.path.realpath(p) for p in (sys.base_prefix, sys.base_exec_prefix, *cfg["site_packages"])}
    keep = {p: os.open(p, os.O_PATH | os.O_DIRECTORY) for p in prefixes if any(_under(p, d) for d in hidden)}
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    size, workdir = cfg["disk_bytes"], cfg["workdir"]
    for d in hidden:
        # tmpfs is RAM outside RLIMIT_AS: only the one holding the working directory gets the disk budget.
        mode, d_size = ("1777" if d in WORLD_WRITABLE else "0755"), (size if _under(workdir, d) else SMALL_TMPFS)
        _mount("tmpfs", d, "tmpfs", MS_NOSUID | MS_NODEV, f"size={d_size},mode={mode}")
    for path, fd in sorted(keep.items()):
        os.makedirs(path, exist_ok=True)
        _mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
        _mount(None, path, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
        os.close(fd)
    os.makedirs(workdir, exist_ok=True)  # the host directory is hidden now: this is a fresh, empty one on a tmpfs
    if not any(_under(workdir, d) for d in hidden):
        _mount("tmpfs", workdir, "tmpfs", MS_NOSUID | MS_NODEV, f"size={size},mode=0700")
        hidden.append(workdir)
    if not cfg["userns"]:  # in a user namespace the program is already the owner (the one mapped user)
        os.chown(workdir, cfg["uid"], cfg["uid"])
    os.chmod(workdir, 0o700)
    _freeze_host_mounts(own=[*hidden, *keep], strict=cfg["userns"])


def _freeze_host_mounts(own: list[str], strict: bool) -> None:
    """Remount every host filesystem read-only in this namespace (the host keeps its own, writable, view).

    As root, file permissions already stop the unprivileged uid almost everywhere; this also closes world-writable
    directories we don't know of, best effort: a mount that refuses (e.g. ``/`` not being a mount point in a
    chroot) keeps only the permission barrier. In a user namespace (``strict``) the program is the invoking user
    to the kernel, so read-only is the only barrier around that user's files: a writable mount that refuses is an
    error.
    """
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        mounts = [line.split() for line in f]
    for fields in mounts:
        target = fields[4].encode().decode("unicode_escape")  # mountinfo escapes spaces etc. as octal (\040)
        if any(_under(target, d) for d in (*own, *KERNEL_FILESYSTEMS)):
            continue
        flags = MS_BIND | MS_REMOUNT | MS_RDONLY
        for option in fields[5].split(","):
            flags |= MOUNT_OPTION_FLAGS.get(option, 0)
        try:
            _mount(None, target, None, flags)
        except OSError:
            if strict and "rw" in fields[5].split(","):
                raise


def _enter_nested_user_namespace(uid: int) -> None:
    """A user namespace of our own where ``uid`` is the one mapped id (it maps to the invoking user outside).

    The mount, PID and network namespaces belong to the enclosing user namespace, so whatever capabilities this
    process holds here give it no power over them (e.g. to unmount the tmpfs hiding ``/home``); and RLIMIT_NPROC
    counts processes per user namespace, so only the program's own.
    """
    if _libc.unshare(CLONE_NEWUSER) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWUSER)")
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} 0 1"), ("gid_map", f"{uid} 0 1")):
        with open(f"/proc/self/{name}", "w") as f:
            f.write(text)


def _drop_capabilities() -> None:
    header = (ctypes.c_uint32 * 2)(LINUX_CAPABILITY_VERSION_3, 0)
    if _libc.capset(header, (ctypes.c_uint32 * 6)()) != 0:  # effective, permitted, inheritable: all empty
        raise OSError(ctypes.get_errno(), "capset")


def _become_untrusted(cfg: dict) -> None:
    if cfg["userns"]:
        _enter_nested_user_namespace(cfg["uid"])  # first: the rlimits below then bind inside it
    limits = {
        resource.RLIMIT_CPU: cfg["cpu_seconds"],
        resource.RLIMIT_AS: cfg["memory_bytes"],
        resource.RLIMIT_NPROC: cfg["max_processes"],
        resource.RLIMIT_FSIZE: cfg["max_output_bytes"],
        resource.RLIMIT_NOFILE: cfg["max_open_files"],
        resource.RLIMIT_CORE: 0,
    }
    for kind, value in limits.items():
        # CPU: hard = soft + 1 so SIGXCPU (catchable, classified as timeout) comes first, SIGKILL as backstop.
        resource.setrlimit(kind, (value, value + 1 if kind == resource.RLIMIT_CPU else value))
    uid = cfg["uid"]
    if not cfg["userns"]:  # a user namespace denies setgroups (and holds no other group to switch to)
        os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)  # as root: every capability is gone now; no_new_privs keeps setuid binaries from them
    _drop_capabilities()  # in a nested user namespace the switch above keeps them
    if _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    os.chdir(cfg["workdir"])
    os.umask(0o077)


def _lazy_module(name: str) -> types.ModuleType:
    """Module ``name``, imported on first attribute access (importlib's documented LazyLoader recipe)."""
    import importlib.util

    spec = importlib.util.find_spec(name)
    if spec is None:
        raise ModuleNotFoundError(f"No module named {name!r}", name=name)
    spec.loader = importlib.util.LazyLoader(spec.loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _run_prelude(prelude: dict, namespace: dict) -> None:
    """The grader's imports, in the program's namespace, compiled apart so the program keeps its line numbers."""
    exec(compile(prelude["source"], "<prelude>", "exec"), namespace)
    for alias, name in prelude["lazy_modules"].items():
        namespace[alias] = _lazy_module(name)


def _run_program(cfg: dict, source: str) -> None:
    """Runs in the forked child as the untrusted uid; exits like ``python solution.py`` would."""
    call = cfg.get("call")
    sys.path.extend(cfg["site_packages"])  # the trainer's packages (numpy...), without running their .pth hooks
    module = types.ModuleType("__main__" if call is None else "solution")
    module.__dict__["__builtins__"] = builtins
    sys.modules[module.__name__] = module
    if cfg["prelude"] is not None:
        _run_prelude(cfg["prelude"], module.__dict__)
    sys.argv = ["solution.py"]
    if call is not None:
        import json

        args = json.loads(sys.stdin.read())  # function-call arguments arrive on stdin
    code = compile(source, "solution.py", "exec")
    exec(code, module.__dict__)
    if call is None:
        return
    owner = module.__dict__.get("Solution")
    fn = getattr(owner(), call, None) if isinstance(owner, type) else None
    fn = fn or module.__dict__.get(call)
    if not callable(fn):
        raise NameError(f"the program defines no function {call!r} (nor a method of class Solution)")
    result = fn(*args)
    with os.fdopen(cfg["result_fd"], "w") as out:
        json.dump(result, out, default=repr)


def _cpu_wait_seconds(pid: int | str) -> float:
    """Seconds ``pid`` has spent runnable but waiting for a CPU (the scheduler's run delay); 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/schedstat", "rb") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


def _wait_for(pid: int, started: float, limit: float, max_stretch: float) -> tuple[bool, float]:
    """Wait for the program to exit within ``limit`` seconds of its own time: (whether it ran out, its own time).

    Its own time is the wall-clock time since it started less the time it waited for a CPU, and less the time this
    process waited for one to see it end, so a program is not failed because others kept the machine busy; sleeping
    or blocking on input counts. A program whose waits keep stretching its deadline (e.g. a fork bomb whose children
    crowd out its main process) is stopped at ``max_stretch`` times its limit of real time all the same. A pidfd
    becomes readable when the program exits (no signal handlers, no `signal` import).
    """
    watcher_waited = _cpu_wait_seconds("self")

    def own_time() -> tuple[float, float]:  # (own, elapsed)
        elapsed = time.monotonic() - started
        return elapsed - _cpu_wait_seconds(pid) - (_cpu_wait_seconds("self") - watcher_waited), elapsed

    pidfd = os.pidfd_open(pid)
    try:
        while True:
            own, elapsed = own_time()
            left = min(limit - own, max_stretch * limit - elapsed)
            # Out of time only if it has not ended meanwhile: this process may have waited long to look.
            if select.select([pidfd], [], [], max(left, 0))[0]:
                return False, own_time()[0]
            if left <= 0:
                return True, own
    finally:
        os.close(pidfd)


def _report(fd: int, **fields) -> None:
    os.write(fd, (repr(fields) + "\n").encode())  # unbuffered: a fork must not duplicate pending output


def main() -> None:
    cfg = marshal.loads(bytes.fromhex(sys.argv[1]))
    status_fd = cfg["status_fd"]
    try:
        with open(cfg["program"], encoding="utf-8") as f:
            source = f.read()
        _isolate_filesystem(cfg)
    except BaseException as e:  # noqa: BLE001 - any setup failure is the sandbox's, reported as such
        _report(status_fd, setup_error=f"{type(e).__name__}: {e}")
        return
    started = time.monotonic()
    pid = os.fork()
    if pid == 0:
        try:
            _become_untrusted(cfg)
        except BaseException as e:  # noqa: BLE001
            _report(status_fd, setup_error=f"{type(e).__name__}: {e}")
            os._exit(1)
        os.close(status_fd)  # the program must not be able to forge its own status
        try:
            _run_program(cfg, source)
        except SystemExit:
            raise
        except BaseException as e:  # noqa: BLE001 - the program's own error: report it as Python would
            tb = e.__traceback__
            while tb is not None and tb.tb_frame.f_code.co_filename != "solution.py":
                tb = tb.tb_next  # hide this script's frames: the traceback should read like the program's own
            sys.__excepthook__(type(e), e.with_traceback(tb), tb)  # C printer: `import traceback` doubles a run
            sys.exit(1)
        sys.exit(0)
    timed_out, own = _wait_for(pid, started, cfg["wall_seconds"], cfg["max_stretch"])
    if timed_out:
        os.kill(pid, 9)  # SIGKILL
    _, wait_status, usage = os.wait4(pid, 0)
    _report(
        status_fd,
        exit_code=os.waitstatus_to_exitcode(wait_status),
        wall_timeout=timed_out,
        run_seconds=own,  # the program's own time: no sandbox setup, no waits for a CPU
        cpu_seconds=usage.ru_utime + usage.ru_stime,
        max_rss_kb=usage.ru_maxrss,
    )


if __name__ == "__main__":
    main()
