"""Content-addressed on-disk cache shared by the NVRTC, CUTLASS and C++-extension build paths.

Everything the toolkit compiles lives under one root: ``$CUTLASS_OPS_CACHE_DIR`` when set (an
absolute path), else the user's cache directory (``platformdirs.user_cache_dir("cutlass_ops")``).
Nothing is ever written to the current directory; directories are created mode 0700.

An entry is a file (or a directory of files) whose name carries its content key. Entries are
built and published under a file lock ``<entry>.lock`` (:func:`entry_lock`), re-checked once the
lock is held, so N processes x M threads that want one entry compile it once. Every published
file has a sidecar ``<file>.sha256``; :func:`load` / :func:`verify` check it on the first load
from disk in a process (then trust the file while its inode, size and mtime stay the same). A
file whose hash does not match is rebuilt with a warning, never loaded. A file without a sidecar
(written by older code, e.g. a carried prebuilt cache) is *adopted*: checked for structure by the
caller's ``validate`` (:func:`looks_like_elf` for cubins and shared libraries), hashed, and its
sidecar written (kept in memory only when the cache is read-only); one that fails the check is
rebuilt. Each build logs ``built <entry>`` on the ``custom_kernels.cache`` logger at INFO.

Shipped kernels: before the user cache, :func:`get_or_build` consults a read-only *prebuilt* tree
with the same layout and keys (:func:`prebuilt_root`: ``$CUTLASS_OPS_PREBUILT_DIR``, else the
``prebuilt/`` directory inside this package, filled by ``scripts/build_wheel.py``). A prebuilt
file is used only with a matching sha256 sidecar (no adoption); a mismatch or a missing sidecar
is ignored with a warning and the user cache / JIT compile used instead. Nothing is ever written
there at run time. An entry found in neither place logs ``not in the shipped kernels: compiling
<entry>`` at INFO before it is compiled.
"""
from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

__all__ = ["ENV_VAR", "PREBUILT_ENV_VAR", "cache_root", "prebuilt_root", "prebuilt_path", "load_prebuilt",
           "cache_dir", "content_key", "atomic_write", "publish", "load", "verify",
           "entry_lock", "get_or_build", "looks_like_elf", "sidecar_path"]

ENV_VAR = "CUTLASS_OPS_CACHE_DIR"
PREBUILT_ENV_VAR = "CUTLASS_OPS_PREBUILT_DIR"
PACKAGE_PREBUILT = Path(__file__).resolve().parent / "prebuilt"
DIR_MODE = 0o700
LOCK_TIMEOUT_S = 1800.0  # a CUTLASS build takes minutes; a dead holder's flock is released by the kernel

log = logging.getLogger(__name__)


def cache_root() -> Path:
    """The root of the cache: ``$CUTLASS_OPS_CACHE_DIR`` or the user's cache directory."""
    override = os.environ.get(ENV_VAR)
    if override:
        path = Path(override).expanduser()
        if not path.is_absolute():  # would follow the cwd, which the CUTLASS bridge changes while it runs
            raise ValueError(f"{ENV_VAR} must be an absolute path, got {override!r}")
        return path.resolve()
    try:
        import platformdirs
    except ImportError:  # e.g. a bare GPU image: follow the XDG rule platformdirs uses on Linux
        base = os.environ.get("XDG_CACHE_HOME", "")
        if not os.path.isabs(base):  # the XDG spec: a relative value is invalid and ignored
            base = str(Path.home() / ".cache")
        return (Path(base) / "cutlass_ops").resolve()
    return Path(platformdirs.user_cache_dir("cutlass_ops")).expanduser().resolve()


def prebuilt_root() -> Path:
    """The read-only tree of shipped kernels: ``$CUTLASS_OPS_PREBUILT_DIR`` or the package's ``prebuilt/``."""
    override = os.environ.get(PREBUILT_ENV_VAR)
    if override:
        path = Path(override).expanduser()
        if not path.is_absolute():
            raise ValueError(f"{PREBUILT_ENV_VAR} must be an absolute path, got {override!r}")
        return path.resolve()
    return PACKAGE_PREBUILT


def prebuilt_path(path: Path) -> Path | None:
    """Where the cache file ``path`` (under :func:`cache_root`) would be in the prebuilt tree, or None."""
    try:
        rel = Path(path).relative_to(cache_root())
    except ValueError:
        return None
    return prebuilt_root() / rel


def _mkdir(path: Path) -> None:
    """Create ``path`` and its missing parents below the cache root with mode 0700."""
    if path.is_dir():
        return
    root = cache_root()
    todo = []
    p = path
    while not p.is_dir() and p != p.parent:
        todo.append(p)
        p = p.parent
    for p in reversed(todo):
        try:  # directories outside the root (the root's parents) get the umask's mode
            p.mkdir(mode=DIR_MODE if (p == root or root in p.parents) else 0o777)
        except FileExistsError:
            pass


def cache_dir(*parts: str) -> Path:
    """A sub-directory of the cache root, created (0700) on demand."""
    path = cache_root().joinpath(*parts)
    _mkdir(path)
    return path


def content_key(*parts: bytes | str) -> str:
    """SHA-256 over the parts, each length-prefixed so that ("ab","c") != ("a","bc")."""
    h = hashlib.sha256()
    for part in parts:
        data = part.encode() if isinstance(part, str) else bytes(part)
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see either nothing or the whole file."""
    _mkdir(path.parent)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


# ------------------------------------------------------------------------------------------------
# verified entries
# ------------------------------------------------------------------------------------------------

def sidecar_path(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def looks_like_elf(data: bytes) -> bool:
    """A whole little-endian 64-bit ELF file (cubin or shared library): the magic, and the section
    and program header tables and every section's contents inside the file. One of them ends the
    file (nvcc's cubins end with the program headers, linkers' libraries with the section
    headers), so a truncated file fails."""
    if len(data) < 64 or data[:6] != b"\x7fELF\x02\x01":
        return False
    u = lambda at, n: int.from_bytes(data[at:at + n], "little")  # noqa: E731
    phoff, shoff, phentsize, phnum, shentsize, shnum = u(0x20, 8), u(0x28, 8), u(0x36, 2), u(0x38, 2), u(0x3A, 2), u(0x3C, 2)
    end = max(64, phoff + phentsize * phnum, shoff + shentsize * shnum)
    if end > len(data) or (shnum and shentsize < 64):
        return False
    for i in range(shnum):
        sh = shoff + i * shentsize
        if u(sh + 4, 4) != 8:  # SHT_NOBITS (.bss) takes no room in the file
            end = max(end, u(sh + 0x18, 8) + u(sh + 0x20, 8))
    return end <= len(data) and end > len(data) - 4096  # nothing but padding after the last part


def publish(path: Path, data: bytes) -> None:
    """Write ``data`` and then its sidecar hash, each atomically (call with the entry lock held)."""
    atomic_write(path, data)
    digest = hashlib.sha256(data).hexdigest()
    atomic_write(sidecar_path(path), digest.encode())
    _remember(path, digest)


_verified: dict[str, tuple[int, int, int, str]] = {}  # path -> (inode, size, mtime_ns, sha256) checked
_verified_lock = threading.Lock()


def _remember(path: Path, digest: str) -> None:
    try:
        st = os.stat(path)
    except OSError:
        return
    with _verified_lock:
        _verified[str(path)] = (st.st_ino, st.st_size, st.st_mtime_ns, digest)


def _check(path: Path, data: bytes | None, st: os.stat_result, validate, warn: bool, readonly: bool = False) -> bool:
    """Whether the file at ``path`` (its bytes ``data``, read from the file ``st`` describes) is whole.
    ``readonly`` (the prebuilt tree): the sidecar must exist and match; nothing is written."""
    known = _verified.get(str(path))
    if known is not None and known[:3] == (st.st_ino, st.st_size, st.st_mtime_ns):
        return True
    if data is None:
        data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    sidecar = sidecar_path(path)
    try:
        expected = sidecar.read_text().strip()
    except FileNotFoundError:
        expected = None
    if readonly:
        if expected != digest:
            if warn:
                why = "has no sha256 sidecar" if expected is None else "does not match its sha256"
                log.warning("shipped kernel %s %s: ignoring it", path, why)
            return False
    elif expected is not None:
        if expected != digest:
            if warn:
                log.warning("cache entry %s does not match its sha256 (corrupted or truncated): rebuilding it", path)
            return False
    else:  # written before sidecars existed: adopt it if it is structurally whole
        if validate is not None and not validate(data):
            if warn:
                log.warning("cache entry %s (no sha256 sidecar) is not a whole file: rebuilding it", path)
            return False
        try:
            atomic_write(sidecar, digest.encode())
            log.info("adopted cache entry %s (sha256 sidecar written)", path)
        except OSError:  # a read-only carried cache: trust it for this process only
            log.info("adopted read-only cache entry %s", path)
    with _verified_lock:
        _verified[str(path)] = (st.st_ino, st.st_size, st.st_mtime_ns, digest)
    return True


def load(path: Path, validate: Callable[[bytes], bool] | None = None, *, warn: bool = True,
         readonly: bool = False) -> bytes | None:
    """The bytes of the cache file ``path`` if present and whole (see the module docstring), else None.
    ``readonly``: a prebuilt file (sidecar required, nothing written)."""
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            data = f.read()
    except FileNotFoundError:
        return None
    return data if _check(path, data, st, validate, warn, readonly) else None


def verify(path: Path, validate: Callable[[bytes], bool] | None = None, *, warn: bool = True,
           readonly: bool = False) -> bool:
    """Whether the cache file ``path`` (loaded by someone else by its path: dlopen) is present and whole."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    return _check(path, None, st, validate, warn, readonly)


def load_prebuilt(path: Path, validate: Callable[[bytes], bool] | None = None) -> tuple[bytes, Path] | None:
    """(bytes, prebuilt path) of the shipped copy of cache file ``path`` if present and whole, else None
    (a damaged copy is ignored with a warning)."""
    shipped = prebuilt_path(path)
    if shipped is None:
        return None
    data = load(shipped, validate, readonly=True)
    return None if data is None else (data, shipped)


_thread_locks: dict[str, threading.Lock] = {}


@contextmanager
def entry_lock(entry: Path, timeout: float = LOCK_TIMEOUT_S) -> Iterator[None]:
    """Hold ``<entry>.lock``: one builder per entry across processes (flock) and threads."""
    import filelock

    _mkdir(entry.parent)
    key = str(entry)
    with _verified_lock:
        tlock = _thread_locks.setdefault(key, threading.Lock())
    with tlock, filelock.FileLock(str(entry) + ".lock", timeout=timeout, mode=0o600):
        yield


def get_or_build(path: Path, build: Callable[[], bytes], validate: Callable[[bytes], bool] | None = None,
                 *, force: bool = False) -> tuple[bytes, bool]:
    """(the bytes of cache file ``path``, whether they came from the cache): the shipped copy
    (:func:`load_prebuilt`), else loaded and verified, else built by ``build()`` and published under
    the entry's lock (re-checked once it is held)."""
    if not force:
        shipped = load_prebuilt(path, validate)
        if shipped is not None:
            return shipped[0], True
        data = load(path, validate, warn=False)  # a mismatch may be a publish in progress: decide under the lock
        if data is not None:
            return data, True
    with entry_lock(path):
        if not force:
            data = load(path, validate)
            if data is not None:
                return data, True
            log.info("not in the shipped kernels: compiling %s", path.name)
        data = build()
        publish(path, data)
    log.info("built %s", path.name)
    return data, False
