"""Content-addressed on-disk cache shared by the NVRTC and CUTLASS build paths.

Everything the toolkit compiles lives under one root: ``$CUTLASS_OPS_CACHE_DIR`` when set,
else the user's cache directory (``platformdirs.user_cache_dir("cutlass_ops")``). Nothing is
ever written to the current directory.
"""
from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

ENV_VAR = "CUTLASS_OPS_CACHE_DIR"


def cache_root() -> Path:
    """The root of the cache: ``$CUTLASS_OPS_CACHE_DIR`` or the user's cache directory."""
    override = os.environ.get(ENV_VAR)
    if override:
        return Path(override).expanduser().resolve()
    try:
        import platformdirs
    except ImportError:  # e.g. a bare GPU image: follow the XDG rule platformdirs uses on Linux
        base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        return (Path(base) / "cutlass_ops").expanduser().resolve()
    return Path(platformdirs.user_cache_dir("cutlass_ops")).expanduser().resolve()


def cache_dir(*parts: str) -> Path:
    """A sub-directory of the cache root, created on demand."""
    path = cache_root().joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
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
    path.parent.mkdir(parents=True, exist_ok=True)
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
