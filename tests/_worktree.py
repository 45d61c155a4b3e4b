"""A copy of the working tree for tests that must not write into it (not a test module)."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def worktree_files() -> list[str]:
    """Tracked and untracked-but-not-ignored files of the checkout, as they are on disk now (so
    uncommitted edits count), minus tracked files deleted from the disk."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                         capture_output=True, check=True).stdout.decode()
    return sorted({f for f in out.split("\0") if f and (ROOT / f).is_file()})


def copy_worktree(dst: Path, commit: bool = False) -> Path:
    """Copy those files to ``dst``; with ``commit``, make ``dst`` a git repository with one commit
    of them (so ``git status`` there shows only what happens after the copy)."""
    for rel in worktree_files():
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, dst / rel)
    if commit:
        git = ["git", "-c", "user.name=test", "-c", "user.email=test@example.invalid", "-c", "commit.gpgsign=false",
               "-c", "core.hooksPath=/dev/null"]
        subprocess.run([*git, "init", "-q"], cwd=dst, check=True)
        subprocess.run([*git, "add", "-A"], cwd=dst, check=True)
        subprocess.run([*git, "commit", "-q", "-m", "snapshot"], cwd=dst, check=True)
    return dst
