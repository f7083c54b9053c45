"""perf_analyzer installed into the virtualenv, from the ``tritonclient==2.41.0`` wheel (why: ``perf.py``'s docstring
and docs/triton.md): the wheel's binary unpacked, its two libraries linked under their plain names, a wrapper that
finds them.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from lazybatch.batcher.errors import ConfigError

WHEEL = "tritonclient==2.41.0"
MEMBER = "tritonclient-2.41.0.data/data/bin/perf_analyzer"


def venv_dir() -> Path:
    return Path(sys.prefix)


def wrapper_path() -> Path:
    return venv_dir() / "bin" / "perf_analyzer"


def find_perf_analyzer(explicit: str | None = None) -> Path | None:
    if explicit:
        p = Path(explicit)
        return p if p.exists() else None
    if wrapper_path().exists():
        return wrapper_path()
    found = shutil.which("perf_analyzer")
    return Path(found) if found else None


def _pytriton_libs() -> Path | None:
    try:
        import pytriton  # type: ignore
    except ImportError:
        return None
    libs = Path(pytriton.__file__).resolve().parent.parent / "nvidia_pytriton.libs"
    return libs if libs.is_dir() else None


def install(force: bool = False) -> Path:
    """Download the tritonclient 2.41.0 wheel, unpack perf_analyzer, link its two libraries, write a wrapper."""
    dest = venv_dir() / "lib" / "lazybatch-perf"
    wrapper = wrapper_path()
    if wrapper.exists() and (dest / "bin" / "perf_analyzer").exists() and not force:
        return wrapper
    (dest / "bin").mkdir(parents=True, exist_ok=True)
    (dest / "lib").mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", tmp, WHEEL]
        r = subprocess.run(cmd, capture_output=True, text=True)
        wheels = sorted(Path(tmp).glob("tritonclient-2.41.0-*.whl"))
        if r.returncode != 0 or not wheels:
            raise ConfigError(f"cannot download {WHEEL}: {r.stderr.strip()[-500:]}")
        with zipfile.ZipFile(wheels[0]) as z:
            data = z.read(MEMBER)
    binary = dest / "bin" / "perf_analyzer"
    binary.write_bytes(data)
    binary.chmod(0o755)
    libs = _pytriton_libs()
    for plain, prefix in (("libb64.so.0d", "libb64-"), ("libcudart.so.12", "libcudart-")):
        src = sorted(libs.glob(f"{prefix}*.so*")) if libs else []
        link = dest / "lib" / plain
        if src:
            if link.is_symlink() or link.exists():
                link.unlink()
            link.symlink_to(src[0])
    wrapper.write_text("#!/usr/bin/env bash\n"
                       f'export LD_LIBRARY_PATH="{dest / "lib"}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}"\n'
                       f'exec "{binary}" "$@"\n')
    wrapper.chmod(0o755)
    r = subprocess.run([str(wrapper), "--version"], capture_output=True, text=True)
    if r.returncode != 0:
        raise ConfigError(f"perf_analyzer was installed but does not run: {(r.stderr or r.stdout).strip()[-500:]}; "
                          "it needs libb64.so.0d and libcudart.so.12 (the serve extra's nvidia-pytriton has both)")
    return wrapper
