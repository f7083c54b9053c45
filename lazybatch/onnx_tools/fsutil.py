"""Write-then-rename helpers: a failed command leaves no half-written file or directory behind."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

from lazybatch.batcher.errors import ConfigError


def check_target(path: Path, force: bool, what: str = "output") -> None:
    if path.exists() and not force:
        raise ConfigError(f"{what} {str(path)!r} already exists; remove it, choose another path, or pass --force "
                          "to replace it")
    if not path.parent.exists():
        raise ConfigError(f"the folder {str(path.parent)!r} for {what} {str(path)!r} does not exist; create it first")


@contextlib.contextmanager
def staging_dir(target: Path) -> Iterator[Path]:
    """A temporary directory next to ``target`` (same filesystem, so the final rename is atomic); removed on error."""
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def replace_dir(tmp: Path, target: Path) -> None:
    """Move a finished staging directory into place, replacing ``target`` (only when --force allowed it)."""
    old = None
    if target.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
        os.rename(target, old / target.name)
    os.rename(tmp, target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def move_files_into_place(tmp: Path, names: list[str], target_dir: Path) -> None:
    """Rename each finished file from ``tmp`` into ``target_dir`` (data files before the model that names them)."""
    for n in names:
        os.replace(tmp / n, target_dir / n)
    shutil.rmtree(tmp, ignore_errors=True)
