"""The grading sandbox: one submitted notebook, one process, limits, no network, no secrets.

The grader (:mod:`workbench.classroom.grading`) starts this module once per submission; it
runs the notebook's cells (:mod:`.runner`) and hands back answers as frames on a file
descriptor. What keeps the submission away from what it must not touch, on Linux:

- **Namespaces** (``unshare --net --mount --pid --fork --mount-proc``; with ``--user
  --map-root-user`` when the grader is not root): no network at all (a fresh network
  namespace with only a loopback device, left down), its own process tree (the grader and
  other processes are invisible, and everything the notebook starts dies with it), its own
  mount table in which every existing mount is made read-only, ``/tmp``, ``/var/tmp`` and
  ``/dev/shm`` are fresh size-limited tmpfs, and the folders to hide (the answer key's folder,
  the submissions folder, the output folder, the instructor's notebook's folder, anything
  passed with ``hide``) are covered by empty tmpfs. The notebook runs in ``/tmp/work``: a
  copy of the submission and the assignment's files, gone when the run ends.
- **An unprivileged user**: a root grader drops to ``nobody`` (uid/gid 65534, no groups, no
  capabilities, ``no_new_privs``), so file permissions protect what the mounts do not, and
  the mounts cannot be undone. Folders an ``nobody`` cannot enter but the run needs (a
  Python installed under ``/root``) are re-exposed read-only under the same paths, inside a
  tmpfs that hides everything else there. A grader that is not root keeps its own uid inside
  a user namespace, with every capability dropped.
- **Resource limits** (``setrlimit``): address space (memory), CPU seconds, size of any file
  written (the frames and the output log included), processes, no core files; and the
  grader's wall-clock timeout kills the whole process tree.

Without ``unshare`` (not Linux, util-linux missing, namespaces forbidden) the grader falls
back to a plain child process with the resource limits and a throwaway working folder,
and says so in its report: then the network is reachable and the notebook can read whatever
the grading user can read (the key is still never given to it, and scores are still decided
by the grader, not by the child).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import resource
import secrets
import shutil
import stat
import sys

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MS_NOATIME, MS_NODIRATIME, MS_RELATIME = 1024, 2048, 1 << 21
MNT_DETACH = 2
PR_SET_NO_NEW_PRIVS, PR_CAPBSET_DROP = 38, 24
NOBODY = 65534
WORK = "/tmp/work"
_SKIP_RO = ("/proc", "/sys", "/dev")


# ----------------------------------------------------------------------------- parent side
def unshare_flags(root: bool) -> list:
    flags = ["--net", "--mount", "--pid", "--fork", "--kill-child", "--mount-proc"]
    return flags if root else ["--user", "--map-root-user"] + flags


def command(spec_path: str, *, namespaces: bool, root: bool) -> list:
    cmd = [sys.executable, "-m", "workbench.classroom.sandbox", spec_path]
    if namespaces:
        return [shutil.which("unshare") or "unshare"] + unshare_flags(root) + ["--"] + cmd
    return cmd


def needed_paths() -> list:
    """Folders the sandboxed Python must read: its installation and import path."""
    import workbench
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix,
             os.path.dirname(os.path.dirname(os.path.abspath(workbench.__file__))),
             os.path.dirname(os.path.realpath(sys.executable))}
    paths.update(p for p in sys.path if p and os.path.isdir(p))
    out = []
    for p in sorted({os.path.realpath(p) for p in paths}):
        if not any(p == q or p.startswith(q.rstrip("/") + "/") for q in out):
            out.append(p)
    return out


def blocking_ancestor(path: str) -> str | None:
    """The first folder on the way to ``path`` that others cannot enter (mode o-x)."""
    parts = os.path.realpath(path).split("/")[1:]
    cur = ""
    for part in parts:
        cur += "/" + part
        try:
            st = os.stat(cur)
        except OSError:
            return None
        if stat.S_ISDIR(st.st_mode) and not st.st_mode & stat.S_IXOTH:
            return cur
    return None


def limits_env(workdir: str) -> dict:
    """The environment of a sandboxed run (nothing inherited but the import path)."""
    import workbench
    pkg_root = os.path.dirname(os.path.dirname(os.path.abspath(workbench.__file__)))
    pp = [pkg_root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": workdir,
            "TMPDIR": workdir, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
            "PYTHONPATH": os.pathsep.join(dict.fromkeys(pp)),
            "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1",
            "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
            "WORKBENCH_OFFLINE": "1", "WORKBENCH_HOME": os.path.join(workdir, ".workbench"),
            "IPYTHONDIR": os.path.join(workdir, ".ipython"),
            "MPLCONFIGDIR": os.path.join(workdir, ".matplotlib"), "MPLBACKEND": "Agg",
            "JUPYTER_PLATFORM_DIRS": "1"}


# ----------------------------------------------------------------------------- child side
_libc = None


def _c():
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    return _libc


def _mount(src, target, fstype, flags, data=None) -> None:
    def enc(s):
        return s.encode() if isinstance(s, str) else s
    r = _c().mount(enc(src), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data))
    if r != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"mount {target}: {os.strerror(e)}")


def _umount(target: str) -> None:
    _c().umount2(target.encode(), MNT_DETACH)


def _mountpoints() -> list:
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            mp = line.split()[4]
            out.append(mp.encode().decode("unicode_escape"))
    return out


def _remount_ro(mp: str) -> None:
    keep = 0
    try:
        fl = os.statvfs(mp).f_flag
    except OSError:
        return
    for st_flag, ms_flag in ((2, MS_NOSUID), (4, MS_NODEV), (8, MS_NOEXEC),
                             (1024, MS_NOATIME), (2048, MS_NODIRATIME), (4096, MS_RELATIME)):
        if fl & st_flag:
            keep |= ms_flag
    _mount(None, mp, None, MS_REMOUNT | MS_BIND | MS_RDONLY | keep)


def _tmpfs(target: str, size: str, mode: str = "1777", ro: bool = False) -> None:
    flags = MS_NOSUID | MS_NODEV | (MS_RDONLY if ro else 0)
    _mount("tmpfs", target, "tmpfs", flags, f"size={size},mode={mode}")


def _under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _read_tree(root: str, limit: int = 512 << 20) -> dict:
    files, total = {}, 0
    for dirpath, _dirs, names in os.walk(root):
        for n in names:
            p = os.path.join(dirpath, n)
            if os.path.islink(p) or not os.path.isfile(p):
                continue
            with open(p, "rb") as f:
                data = f.read(limit - total + 1)
            total += len(data)
            if total > limit:
                raise OSError(f"the submission's files exceed {limit >> 20} MiB")
            files[os.path.relpath(p, root)] = data
    return files


def setup_mounts(spec: dict, notes: list) -> str:
    """Inside the new mount namespace (as its root): the mounts described in the module
    docstring. Returns the working folder."""
    files = _read_tree(spec["workdir"])
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    for mp in sorted(set(_mountpoints()), key=len):
        if mp == "/" or not mp.startswith(_SKIP_RO):
            try:
                _remount_ro(mp)
            except OSError as e:
                notes.append(f"could not make {mp} read-only ({e.strerror})")
    # what the run needs from a temporary folder about to be replaced (a checkout or a
    # virtual environment under /tmp): parked under /dev/shm, put back read-only after
    parked = []
    for p in spec.get("needed", []):
        if _under(p, "/tmp") or _under(p, "/var/tmp"):
            s = f"/dev/shm/.wb-keep-{secrets.token_hex(8)}"   # the host's /dev/shm, still
            os.mkdir(s, 0o700)
            _mount(p, s, None, MS_BIND | MS_REC)
            parked.append((p, s))
    _tmpfs("/tmp", spec.get("tmp_size", "512m"))
    if os.path.isdir("/var/tmp"):
        _tmpfs("/var/tmp", "64m")
    for p, s in parked:
        os.makedirs(p, mode=0o755, exist_ok=True)
        _mount(s, p, None, MS_BIND | MS_REC)
        _remount_ro(p)
        _umount(s)
        os.rmdir(s)
    if os.path.isdir("/dev/shm"):
        try:
            _tmpfs("/dev/shm", "64m")
        except OSError as e:
            notes.append(f"could not replace /dev/shm ({e.strerror})")
    _expose(spec.get("expose", []), notes)
    for h in spec.get("hide", []):
        if not os.path.exists(h):            # gone with /tmp, or under a masked folder
            continue
        try:
            if os.path.isdir(h):
                _tmpfs(h, "4k", mode="0755", ro=True)
            else:
                _mount("/dev/null", h, None, MS_BIND)
        except OSError as e:
            notes.append(f"could not hide {h} ({e.strerror})")
    os.makedirs(WORK, mode=0o755)
    for rel, data in files.items():
        p = os.path.join(WORK, rel)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "wb") as f:
            f.write(data)
    return WORK


def _expose(groups: list, notes: list) -> None:
    """For each ``{"mask": A, "paths": [...]}``: cover A with a tmpfs that shows only the
    given paths (bind-mounted read-only under their own names)."""
    stage = "/tmp/.expose"
    for g in groups:
        staged = []
        for i, p in enumerate(g["paths"]):
            s = f"{stage}/{len(staged)}-{i}"
            os.makedirs(s)
            _mount(p, s, None, MS_BIND | MS_REC)
            staged.append((p, s))
        _tmpfs(g["mask"], "1m", mode="0755")
        for p, s in staged:
            os.makedirs(p, mode=0o755, exist_ok=True)
            _mount(s, p, None, MS_BIND | MS_REC)
            try:
                _remount_ro(p)
            except OSError as e:
                notes.append(f"{p} stays writable ({e.strerror})")
            _umount(s)
        _remount_ro(g["mask"])
    shutil.rmtree(stage, ignore_errors=True)


def drop_privileges(uid: int | None, gid: int | None) -> None:
    """Leave root (or a user namespace's root) for good: no groups, the given uid/gid, no
    capabilities in any set, and no way back through setuid programs."""
    libc = _c()
    libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    if uid is not None:
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)
        return
    for cap in range(64):
        libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                    ("inheritable", ctypes.c_uint32)]

    hdr = Header(0x20080522, 0)
    data = (Data * 2)()
    if libc.capset(ctypes.byref(hdr), data) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"capset: {os.strerror(e)}")


def set_limits(lim: dict) -> None:
    def setl(which, soft, hard=None):
        if soft is None:
            return
        hard = soft if hard is None else hard
        _, cur_hard = resource.getrlimit(which)
        if cur_hard != resource.RLIM_INFINITY:
            soft, hard = min(soft, cur_hard), min(hard, cur_hard)
        resource.setrlimit(which, (soft, hard))
    setl(resource.RLIMIT_CORE, 0)
    setl(resource.RLIMIT_AS, lim.get("memory"))
    cpu = lim.get("cpu")
    setl(resource.RLIMIT_CPU, cpu, None if cpu is None else cpu + 2)
    setl(resource.RLIMIT_FSIZE, lim.get("output"))
    setl(resource.RLIMIT_NPROC, lim.get("processes"))


def child_main(spec_path: str) -> int:
    with open(spec_path) as f:
        spec = json.load(f)
    notes: list = []
    workdir = spec["workdir"]
    fd = spec["frames_fd"]
    if spec.get("namespaces"):
        try:
            workdir = setup_mounts(spec, notes)
        except OSError as e:
            os.write(fd, (json.dumps({"type": "sandbox", "error": f"setup failed: {e}"})
                          + "\n").encode())
            return 70
    uid, gid = spec.get("uid"), spec.get("gid")
    if uid is not None:
        for dirpath, dirs, names in os.walk(workdir):
            for n in [dirpath] + [os.path.join(dirpath, x) for x in dirs + names]:
                os.chown(n, uid, gid)
    env = spec["env"]
    env = {k: v.replace("{WORK}", workdir) for k, v in env.items()}
    for sub in (".workbench", ".ipython", ".matplotlib"):
        p = os.path.join(workdir, sub)
        os.makedirs(p, exist_ok=True)
        if uid is not None:
            os.chown(p, uid, gid)
    if spec.get("namespaces") or uid is not None:
        try:
            drop_privileges(uid, gid)
        except OSError as e:
            os.write(fd, (json.dumps({"type": "sandbox", "error": f"could not drop "
                                      f"privileges: {e}"}) + "\n").encode())
            return 71
    set_limits(spec.get("limits", {}))
    os.environ.clear()
    os.environ.update(env)
    os.chdir(workdir)
    from workbench.classroom.runner import FrameWriter, run_notebook
    frames = FrameWriter(fd)
    frames({"type": "sandbox", "notes": notes, "uid": os.getuid()})
    # the notebook runs in a child: this process is the namespace's init, which the kernel
    # spares signals it has no handler for (RLIMIT_CPU's SIGXCPU included)
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            if spec.get("probe"):
                import IPython  # noqa: F401
                import numpy  # noqa: F401
                import onnx  # noqa: F401
                frames({"type": "done", "errors": 0})
            else:
                run_notebook(os.path.join(workdir, spec["notebook"]), mode="grade",
                             frames_fd=fd, checks=spec.get("checks"))
        except BaseException as e:  # noqa: BLE001 - reported, then this process ends
            try:
                frames({"type": "runner", "error": f"{type(e).__name__}: {e}"[:500]})
            except BaseException:   # noqa: BLE001 - the frames file may be the problem
                pass
            code = 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            frames({"type": "exit", "signal": sig})
        except OSError:
            pass
        return 128 + sig
    return os.WEXITSTATUS(status)


if __name__ == "__main__":
    sys.exit(child_main(sys.argv[1]))
