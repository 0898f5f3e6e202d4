"""The sandbox that untrusted code runs in: a student's build and task process, when the grader
grades submissions (`python -m grader submission`, `gradebook`, or GRADER_SANDBOX=1).

`enter(policy)` turns the calling process into a sandboxed one. It must run in a fresh,
single-threaded process (straight after a fork, before torch starts threads), and gives it:

- no network: a network namespace with only a loopback interface;
- its own process tree: a PID namespace, so a process left behind dies with the task, and a
  /proc that shows no process outside the sandbox (the grader's, the shell's, their environments);
- a read-only filesystem: every mount is remounted read-only, except a private, size-limited
  scratch folder (`policy.work`, a tmpfs that vanishes with the task), a fresh /dev/shm, and the
  folders `policy.writable` names (a build's output folder);
- only the part of the grader's checkout a task needs (`shown_entries`): the grader's code, the
  labs' files, the specs and the Python environment. Everything else of it is covered by an empty
  folder: the reference solutions (`labN/solutions`), the labs' results, `.git`, gradebooks
  (`grade-results`), and `.build`, where the other submissions' graded copies and every built
  library live (a private, empty, writable `.build` stands in its place, where lab 4 and 5 build
  their kernels). What a task needs from a hidden place comes through `policy.readable` (nvcc's
  source, a task's inbox of copies, which grader/parent/isolation.py fills once the job is known);
- an empty /tmp instead of the host's, where other grading runs keep their files and the fork
  server its socket (what the task needs there, its scratch folder and inbox, is bound back);
- an unprivileged user: `nobody` when the grader runs as root; otherwise the grader's own user
  in a user namespace, with every capability dropped and no way to regain one;
- limits: memory (RLIMIT_DATA), processes, the size of any one file it writes (its output too).

What does not hold on this machine is said in the returned list, never silently skipped.
The environment is the caller's job (`scrubbed_env`): secrets never reach the sandbox at all.

    python -I grader/parent/sandbox.py POLICY-JSON -- command args...   (enter, then exec)
"""

from __future__ import annotations

import ctypes
import ctypes.util
import fcntl
import json
import os
import re
import resource
import shlex
import signal
import socket
import struct
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

NOBODY = 65534
_ROOT = Path(__file__).resolve().parents[2]  # the grader's checkout (this file runs as a script too)
CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x00020000, 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 0x1, 0x2, 0x4, 0x8
MS_REMOUNT, MS_NOATIME, MS_NODIRATIME, MS_BIND = 0x20, 0x400, 0x800, 0x1000
MS_REC, MS_PRIVATE, MS_RELATIME, MS_STRICTATIME = 0x4000, 0x40000, 0x200000, 0x1000000
PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS = 4, 38
SIOCSIFFLAGS, IFF_UP, IFF_LOOPBACK, IFF_RUNNING = 0x8914, 0x1, 0x8, 0x40
# mount flags a user namespace may not clear on a mount it inherited: kept as they are
_KEPT = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC, "noatime": MS_NOATIME,
         "nodiratime": MS_NODIRATIME, "relatime": MS_RELATIME, "strictatime": MS_STRICTATIME}  # fmt: skip
# kernel file systems whose mounts stay as they are (devices must open read-write)
_SPECIAL = ("/proc", "/sys", "/dev")

# what a task process may inherit from the grader's environment: the toolchain, Python, CUDA and
# the grader's own settings. Everything else (tokens, cloud credentials, SSH agents, GRADER_SEED)
# stays out, whatever it is called.
_ALLOWED = {"PATH", "LANG", "LANGUAGE", "TERM", "TZ", "LD_LIBRARY_PATH", "PYTHONPATH", "PYTHONUNBUFFERED",
            "PYTHONHASHSEED", "PYTHONDONTWRITEBYTECODE", "VIRTUAL_ENV", "CONDA_PREFIX", "CC", "CXX",
            "CUDAHOSTCXX", "OMP_NUM_THREADS", "OMP_WAIT_POLICY", "MKL_NUM_THREADS", "CI"}  # fmt: skip
_ALLOWED_PREFIXES = ("LC_", "CUDA_", "NVIDIA_", "TORCH_", "PYTORCH_", "GRADER_", "NCCL_", "CUBLAS_", "CUDNN_")
_SECRET_WORDS = ("SEED", "SECRET", "TOKEN", "PASSWORD", "PASSWD", "CREDENTIAL", "KEY", "AUTH")

# what of the checkout's top level a task sees: the grader's code (the task process imports it, and
# the fixture tasks live in grader/tests), pytest's configuration, and the labs (their packages,
# specs, course sources, headers and prepared data). All of it ships in the student release; the
# top-level folder that holds the Python (a .venv) is shown too (`shown_entries`).
_SHOWN = ("grader", "conftest.py", "pyproject.toml")
_LAB = re.compile(r"lab\d+$")
_HIDDEN_IN_LABS = ("solutions", "results")  # the reference solutions, and benchmark results
_PRIVATE = ".build"  # other submissions' copies and libraries: replaced by a private, writable tmpfs
_NEVER_SHOWN = (".git", _PRIVATE)


class SandboxError(RuntimeError):
    """The sandbox could not be set up in a way the policy requires."""


@dataclass(frozen=True)
class Policy:
    work: str  # the task's private scratch folder: a fresh tmpfs of work_bytes, removed with it
    writable: tuple[str, ...] = ()  # existing folders it may also write (a build's output folder)
    readable: tuple[str, ...] = ()  # files or folders it may read even where the checkout is hidden
    memory_bytes: int = 32 << 30  # data segment (RLIMIT_DATA): CUDA's address-space reservations do not count
    processes: int = 2048  # processes and threads of its user, beyond those it already has
    file_bytes: int = 256 << 20  # any one file it writes, its stdout and stderr included
    work_bytes: int = 2 << 30
    user: int = NOBODY  # who it runs as when the grader is root

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Policy:
        d = json.loads(text)
        d["writable"] = tuple(d.get("writable", ()))
        d["readable"] = tuple(d.get("readable", ()))
        return cls(**d)


def enabled() -> bool:
    """Sandbox every task, not only submissions' (GRADER_SANDBOX=1)."""
    return os.environ.get("GRADER_SANDBOX") == "1"


def scrubbed_env(env: dict[str, str], work: str | None = None) -> dict[str, str]:
    """The environment a sandboxed process gets: allowed names only, no secret-looking ones, and
    every place tools write to (home, temp, caches) inside its scratch folder."""
    out = {}
    for name, value in env.items():
        allowed = name in _ALLOWED or name.startswith(_ALLOWED_PREFIXES)
        if allowed and not any(w in name.upper() for w in _SECRET_WORDS):
            out[name] = value
    if work:
        for name in ("HOME", "TMPDIR", "XDG_CACHE_HOME"):
            out[name] = work
        out["TORCHINDUCTOR_CACHE_DIR"] = f"{work}/inductor"
        out["TRITON_CACHE_DIR"] = f"{work}/triton"
        out["GRADER_SANDBOX_WORK"] = work
    return out


# --- entering it ---------------------------------------------------------------------------------

_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = [None if s is None else s.encode() for s in (source, target, fstype, data)]
    _check(_libc.mount(enc[0], enc[1], enc[2], ctypes.c_ulong(flags), enc[3]), f"mount {target}")


def _mounts() -> list[tuple[str, int]]:
    """Every mount point, with the flags it must keep, outermost first."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        parts = line.split()
        point = parts[4].encode().decode("unicode_escape")
        kept = 0
        for opt in parts[5].split(","):
            kept |= _KEPT.get(opt, 0)
        found.append((point, kept))
    return found


def _read_only_everywhere(notes: list[str]) -> None:
    _mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing done here leaks out to the host
    failed = []
    for point, kept in _mounts():
        if any(point == s or point.startswith(s + "/") for s in _SPECIAL):
            continue
        try:
            _mount(None, point, None, MS_REMOUNT | MS_BIND | MS_RDONLY | kept)
        except OSError as e:
            failed.append(f"{point} ({e.strerror})")
    if failed:
        notes.append("could not make read-only: " + ", ".join(failed[:5]))


def _writable(policy: Policy, owner: tuple[int, int]) -> None:
    size = f"size={policy.work_bytes},mode=0700,uid={owner[0]},gid={owner[1]}"
    _mount("tmpfs", policy.work, "tmpfs", MS_NOSUID | MS_NODEV, size)
    if Path("/dev/shm").is_dir():
        _mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, f"size={policy.work_bytes},mode=1777")
    for folder in policy.writable:
        _mount(folder, folder, None, MS_BIND | MS_REC)
        kept = dict(_mounts()).get(folder, 0)
        _mount(None, folder, None, MS_REMOUNT | MS_BIND | kept)  # the bind came read-only: undo that here only


def _needed() -> list[Path]:
    """What the sandbox's user must reach: this Python (its real files), the grader's checkout,
    and the folders on PYTHONPATH."""
    found = [Path(os.path.realpath(sys.executable)), Path(sys.base_prefix), Path(sys.prefix), _ROOT]
    found += [Path(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return [p for p in found if p.exists()]


def _first_closed(p: Path) -> Path | None:
    """The outermost folder on the way to `p`, `p` included, that other users cannot pass
    through (a private home, or a checkout made by `mktemp -d`)."""
    for a in [*reversed(p.parents), *([p] if p.is_dir() else [])]:
        if not a.stat().st_mode & 0o001:
            return a
    return None


def _expose(needed: list[Path], stage: Path) -> None:
    """Lets `nobody` reach what it needs under folders private to root (a Python installed in
    /root, say): each such folder is covered by an empty tmpfs, into which only the needed
    entries are bound back, read-only. The rest of that folder (~/.ssh, tokens) stays out of sight."""
    for _ in range(8):  # a closed folder may sit under another one
        closed: dict[Path, set[str]] = {}
        for p in needed:
            a = _first_closed(p)
            if a is not None:  # what lies under it on the way to p; all of it when p is the closed one
                below = p.relative_to(a).parts[:1] or os.listdir(a)
                closed.setdefault(a, set()).update(below)
        if not closed:
            return
        for folder, names in closed.items():
            staged = []
            for name in sorted(names):
                hold = stage / f"{len(list(stage.iterdir()))}"
                hold.mkdir() if (folder / name).is_dir() else hold.touch()
                _mount(str(folder / name), str(hold), None, MS_BIND | MS_REC)
                staged.append((name, hold))
            _mount("tmpfs", str(folder), "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m")
            for name, hold in staged:
                target = folder / name
                target.mkdir() if hold.is_dir() else target.touch()
                _mount(str(hold), str(target), None, MS_BIND | MS_REC)
                _mount(None, str(target), None, MS_REMOUNT | MS_BIND | MS_RDONLY | dict(_mounts()).get(str(target), 0))
                _check(_libc.umount2(str(hold).encode(), 2), f"umount {hold}")  # MNT_DETACH


# --- what of the checkout it sees ----------------------------------------------------------------


def _interpreter() -> list[Path]:
    """The folders this Python runs from and imports from (PYTHONPATH)."""
    found = [Path(sys.executable), Path(os.path.realpath(sys.executable)), Path(sys.prefix), Path(sys.base_prefix)]
    return found + [Path(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]


def shown_entries(root: Path = _ROOT) -> set[str]:
    """The names at the top of the checkout that a sandboxed process sees."""
    names = set(_SHOWN) | {p.name for p in root.iterdir() if _LAB.match(p.name) and p.is_dir()}
    # as given and resolved: a .venv in the checkout that links to a Python elsewhere is still the
    # path the task process is started by
    for path in (q for p in _interpreter() for q in (Path(os.path.abspath(p)), Path(os.path.realpath(p)))):
        try:
            parts = path.relative_to(root).parts
        except ValueError:
            continue
        if parts and parts[0] not in _NEVER_SHOWN:  # PYTHONPATH=<checkout> shows nothing more
            names.add(parts[0])
    return names


def hidden(path: str | Path, shown: set[str] | None = None, root: Path = _ROOT) -> bool:
    """Whether the sandbox hides `path` (a path of the checkout it does not show, or `.build`)."""
    try:
        parts = Path(os.path.realpath(path)).relative_to(root).parts
    except ValueError:
        return False
    if not parts:
        return False
    if parts[0] not in (shown if shown is not None else shown_entries(root)):
        return True
    return bool(_LAB.match(parts[0])) and len(parts) > 1 and parts[1] in _HIDDEN_IN_LABS


def named_files(args: list[str]) -> tuple[str, ...]:
    """The existing files a command names by absolute path, in its arguments or in a shell line
    it runs (`sh -c "nvcc ... -c /abs/source.cu"`): the grader writes the command, so what it
    names is what the step is meant to read (a graded copy under the hidden .build)."""
    words: list[str] = []
    for arg in args:
        try:
            words += shlex.split(arg) if any(c.isspace() for c in arg) else [arg]
        except ValueError:  # not a shell line
            words.append(arg)
    return tuple(dict.fromkeys(w for w in words if os.path.isabs(w) and os.path.isfile(w)))


def _put_back(fd: int, target: Path, read_only: bool) -> None:
    """Binds what `fd` opened (before it was covered) at `target`, creating the mount point."""
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        target.mkdir() if os.path.isdir(f"/proc/self/fd/{fd}") else target.touch()
    _mount(f"/proc/self/fd/{fd}", str(target), None, MS_BIND | MS_REC)
    if read_only:
        _mount(None, str(target), None, MS_REMOUNT | MS_BIND | MS_RDONLY | dict(_mounts()).get(str(target), 0))


def _cover(folder: Path, data: str) -> None:
    _mount("tmpfs", str(folder), "tmpfs", MS_NOSUID | MS_NODEV, data)


def _seal(folder: Path) -> None:
    """A tmpfs made here (so no flag of it is locked) becomes read-only."""
    _mount(None, str(folder), None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)


def _kept(policy: Policy, covered: Callable[[str], bool], more: tuple[str, ...] = ()) -> dict[str, bool]:
    """What of the policy's own paths (and `more`, read-only) a cover would hide, outermost only
    (a bind brings what is mounted below it along): path -> whether it stays writable."""
    writable = {os.path.realpath(p) for p in (policy.work, *policy.writable)}
    wanted = writable | {os.path.realpath(p) for p in (*policy.readable, *more)}
    out: dict[str, bool] = {}
    for p in sorted(wanted, key=len):
        if os.path.exists(p) and covered(p) and not any(p.startswith(o.rstrip("/") + "/") for o in out):
            out[p] = p in writable
    return out


def _hide_checkout(policy: Policy, owner: tuple[int, int], root: Path = _ROOT) -> str:
    """Covers the checkout with an empty tmpfs and binds back only what a task needs; the labs'
    hidden folders get an empty one each, `.build` a private writable one. Paths of the policy
    that lie in a hidden place (its scratch and writable folders, what it may read) are bound
    back too, from descriptors opened before anything was covered. Returns what holds."""
    shown = shown_entries(root)
    keep = _kept(policy, lambda p: hidden(p, shown, root))
    links = {n: os.readlink(root / n) for n in shown if (root / n).is_symlink()}
    fds: dict[str, int] = {}
    try:
        for name in sorted(shown - set(links)):
            if (root / name).exists():
                fds[str(root / name)] = os.open(root / name, os.O_PATH | os.O_CLOEXEC)
        for p in keep:
            fds[p] = os.open(p, os.O_PATH | os.O_CLOEXEC)
        _cover(root, "mode=0755,size=1m")
        for name, target in links.items():
            (root / name).symlink_to(target)
        for name in sorted(shown - set(links)):
            if str(root / name) in fds:
                _put_back(fds[str(root / name)], root / name, read_only=True)
        covered = [root / lab / name for lab in shown if _LAB.match(lab) for name in _HIDDEN_IN_LABS]
        covered = [c for c in covered if c.is_dir() and not c.is_symlink()]
        for folder in covered:
            _cover(folder, "mode=0755,size=1m")
        (root / _PRIVATE).mkdir()
        _cover(root / _PRIVATE, f"size={policy.work_bytes},mode=0700,uid={owner[0]},gid={owner[1]}")
        for p, writable in keep.items():
            _put_back(fds[p], Path(p), read_only=not writable)
        for folder in [*covered, root]:
            _seal(folder)
    finally:
        for fd in fds.values():
            os.close(fd)
    labs = sorted((n for n in shown if _LAB.match(n)), key=lambda n: int(n[3:]))
    others = sorted(n for n in shown if not _LAB.match(n))
    return (
        f"of the grader's checkout only {', '.join(others)} and the labs ({', '.join(labs)}) without their "
        f"{' and '.join(_HIDDEN_IN_LABS)}; a private, empty .build"
    )


def _private_tmp(policy: Policy, tmp: Path = Path("/tmp")) -> str:
    """An empty, read-only /tmp: the host's holds other grading runs' files (another submission's
    task output, its inbox), the fork server's socket (which a process of the grader's own user
    could ask for a task process outside the sandbox) and whatever other users leave there. What
    the task needs under it (its scratch folder, its inbox, a checkout or Python kept in /tmp) is
    bound back."""
    inside = str(tmp).rstrip("/") + "/"
    keep = _kept(policy, lambda p: p.startswith(inside), (str(_ROOT), *map(str, _interpreter())))
    fds = {p: os.open(p, os.O_PATH | os.O_CLOEXEC) for p in keep}
    try:
        _cover(tmp, "mode=1777,size=1m")
        for p, writable in keep.items():
            _put_back(fds[p], Path(p), read_only=not writable)
        _seal(tmp)  # read-only, as the host's was: temporary files go to the scratch folder (TMPDIR)
    finally:
        for fd in fds.values():
            os.close(fd)
    return "an empty /tmp (not the host's: other grading runs' files, the fork server's socket)"


def _loopback_up() -> None:
    """Only a loopback interface, up: local sockets (a notebook kernel's) work, nothing leaves."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH14s", b"lo", IFF_UP | IFF_LOOPBACK | IFF_RUNNING, b""))


def _processes_of(uid: int) -> int:
    n = 0
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                n += len(list((d / "task").iterdir())) if d.stat().st_uid == uid else 0
            except OSError:
                pass
    return n


def _limits(policy: Policy, nproc: int) -> None:
    for which, value in (
        (resource.RLIMIT_DATA, policy.memory_bytes),
        (resource.RLIMIT_NPROC, nproc),
        (resource.RLIMIT_FSIZE, policy.file_bytes),
        (resource.RLIMIT_CORE, 0),
    ):
        resource.setrlimit(which, (value, value))


def _drop_capabilities() -> None:
    """In a user namespace the process is root over its own namespaces: give that up too."""
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable: all empty
    _check(_libc.syscall(126 if os.uname().machine == "x86_64" else 91, header, data), "capset")


def _become_init_of_pid_namespace() -> None:
    """After unshare(CLONE_NEWPID) only a child joins the namespace: fork, and let this process
    wait and leave as its child did, so whoever waits for it sees the task's own status. When the
    child (the namespace's init) ends, the kernel kills whatever it left behind."""
    pid = os.fork()
    if pid == 0:
        return
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda s, _f, pid=pid: os.kill(pid, s))
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except ChildProcessError:
            os._exit(3)
        except InterruptedError:
            continue
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        signal.signal(sig, signal.SIG_DFL)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        os.kill(os.getpid(), sig)
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 3)


def enter(policy: Policy) -> list[str]:
    """Sandboxes this (fresh, single-threaded) process; returns what holds, and what could not
    ("NOT HELD: ..."), for the report.

    With namespaces it returns in a new process (the PID namespace's first); the calling process
    stays behind as its parent and exits with its status.
    """
    held: list[str] = []
    root = os.geteuid() == 0
    uid, gid = os.getuid(), os.getgid()
    owner = (policy.user, policy.user) if root else (uid, gid)
    Path(policy.work).mkdir(parents=True, exist_ok=True)
    nproc = _processes_of(policy.user if root else uid) + policy.processes  # counted while all are visible
    ns = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | (0 if root else CLONE_NEWUSER)
    try:
        _check(_libc.unshare(ns), "unshare")
    except OSError as e:
        held.append(
            f"NOT HELD: no namespaces ({e.strerror}), so the network, other processes and the file system "
            "are as open to it as to the grader; run the grader as root in a VM or container, or allow "
            "unprivileged user namespaces (sysctl user.max_user_namespaces, kernel.unprivileged_userns_clone)"
        )
    else:
        if not root:  # the same user inside as outside: files keep their owners
            Path("/proc/self/setgroups").write_text("deny")
            Path("/proc/self/uid_map").write_text(f"{uid} {uid} 1")
            Path("/proc/self/gid_map").write_text(f"{gid} {gid} 1")
        _read_only_everywhere(held)
        _writable(policy, owner)
        held.append("read-only file system except its scratch folder")
        if root and Path("/dev/shm").is_dir():  # (the stage must lie outside every folder it covers)
            stage = Path("/dev/shm/.grader-stage")
            stage.mkdir()
            _expose(_needed(), stage)
        try:
            held.append(_hide_checkout(policy, owner))
            if Path("/tmp").is_dir():
                held.append(_private_tmp(policy))
        except OSError as e:  # a half-built view of the files is no sandbox to run in
            raise SandboxError(f"could not hide the checkout's solutions and other submissions: {e}") from e
        _become_init_of_pid_namespace()
        try:
            _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
            held.append("own process tree (PID namespace, its own /proc)")
        except OSError as e:
            held.append(f"NOT HELD: a /proc of its own ({e.strerror}): processes outside stay visible")
        try:
            _loopback_up()
            held.append("no network (a network namespace with loopback only)")
        except OSError as e:
            held.append(f"no network (a network namespace; its loopback is down: {e.strerror})")
    _limits(policy, nproc)
    held.append(
        f"limits: {policy.memory_bytes >> 30} GiB of memory, {policy.processes} more processes, "
        f"{policy.file_bytes >> 20} MiB per file written"
    )
    if root:
        os.setgroups([])
        os.setresgid(policy.user, policy.user, policy.user)
        os.setresuid(policy.user, policy.user, policy.user)
        held.append(f"runs as uid {policy.user} (nobody), not root")
    elif ns_ok(held):
        _drop_capabilities()
        held.append(f"runs as uid {uid} with no capabilities (user namespace)")
    else:
        held.append(f"runs as uid {uid}, the grader's own user")
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(NO_NEW_PRIVS)")
    os.chdir(policy.work)
    return held


def ns_ok(held: list[str]) -> bool:
    return not any(h.startswith("NOT HELD: no namespaces") for h in held)


def give_to_sandbox(folder: Path, user: int = NOBODY) -> None:
    """A folder the sandboxed process writes (a build's), made its own under a root grader."""
    if os.geteuid() != 0:
        return
    for p in [folder, *folder.rglob("*")]:
        os.chown(p, user, user)


def command(policy: Policy) -> list[str]:
    """The prefix that runs a command in this policy's sandbox. This file runs as a script, in
    isolated mode: whatever the working folder and PYTHONPATH, it imports nothing from them."""
    return [sys.executable, "-I", str(Path(__file__).resolve()), policy.to_json(), "--"]


def hide_this_process() -> None:
    """Makes the grading process non-dumpable: a process of the same user can then read neither
    its memory nor its /proc/PID/environ (where GRADER_SEED is)."""
    _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)


def probe(policy: Policy) -> list[str]:
    """What the sandbox holds on this machine, found by entering it in a throwaway process."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            msg = {"held": enter(policy)}
        except (SandboxError, OSError) as e:
            msg = {"error": str(e)}
        os.write(w, json.dumps(msg).encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        text = f.read()
    os.waitpid(pid, 0)
    msg = json.loads(text or '{"error": "the probe died"}')
    if "error" in msg:
        raise SandboxError(msg["error"])
    return msg["held"]


def main(argv: list[str]) -> int:
    """Enter the sandbox the policy describes, then become the command after `--`."""
    if len(argv) < 3 or argv[1] != "--":
        sys.stderr.write("usage: python -I grader/parent/sandbox.py POLICY-JSON -- command args...\n")
        return 2
    policy = Policy.from_json(argv[0])
    policy = replace(policy, readable=(*policy.readable, *named_files(argv[2:])))
    try:
        held = enter(policy)
    except SandboxError as e:
        sys.stderr.write(f"sandbox: {e}\n")
        return 4
    env = scrubbed_env(dict(os.environ), policy.work)
    env["GRADER_SANDBOX_HELD"] = json.dumps(held)
    os.execvpe(argv[2], argv[2:], env)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
