#!/usr/bin/env python3
"""Carry onnxruntime-gpu to a lent GPU machine in parts, each checked by sha256, and install it there.

A device call sends the working tree (about 11 MB) and at most 64 MiB in all, and the machine stays warm only
30 s between calls; the onnxruntime-gpu wheel for CUDA 13 is about 244 MiB. So the wheel travels in parts of at
most ``--part-mib`` MiB, one part per call, made back to back; a part already on the machine with the right sha256
is not sent again (``have`` says which are missing), and ``install`` reassembles the wheel, checks the whole
file's sha256 and installs it into a folder of its own (the machine's Python keeps its CPU onnxruntime; the
folder goes first on PYTHONPATH). docs/deploy.md ("The GPU check") lists the calls.

    python3 scripts/gpu_carry.py prepare [--wheel FILE] [--version 1.31.1]   # here: download, split, plan
    python3 scripts/gpu_carry.py have                                      # there: which parts have arrived
    python3 scripts/gpu_carry.py install [--target /tmp/site]              # there: reassemble, check, install
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CARRY = ".gpucarry"  # ignored through .git/info/exclude: never committed, carried by name
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def split(wheel: Path, folder: Path, part_bytes: int) -> dict:
    """``folder/part-NN`` files of at most ``part_bytes`` and ``folder/carry.json`` naming them with their sha256."""
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("part-*"):
        old.unlink()
    parts = []
    with wheel.open("rb") as f:
        for i, block in enumerate(iter(lambda: f.read(part_bytes), b"")):
            p = folder / f"part-{i:02d}"
            p.write_bytes(block)
            parts.append({"name": p.name, "bytes": len(block), "sha256": hashlib.sha256(block).hexdigest()})
    manifest = {"wheel": wheel.name, "bytes": wheel.stat().st_size, "sha256": sha256(wheel), "parts": parts}
    (folder / "carry.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def missing(folder: Path) -> list[str]:
    """The parts not yet in ``folder`` with their recorded size and sha256 (a truncated transfer counts as missing)."""
    manifest = json.loads((folder / "carry.json").read_text())
    out = []
    for part in manifest["parts"]:
        p = folder / part["name"]
        if not p.is_file() or p.stat().st_size != part["bytes"] or sha256(p) != part["sha256"]:
            out.append(part["name"])
    return out


def reassemble(folder: Path, dest: Path) -> Path:
    """The wheel rebuilt from its parts under ``dest``, its sha256 checked; an error names what is missing."""
    manifest = json.loads((folder / "carry.json").read_text())
    gone = missing(folder)
    if gone:
        raise SystemExit(f"gpu_carry: {len(gone)} part(s) missing or damaged: {', '.join(gone)}; carry them "
                         f"(run's carry: {', '.join(f'{CARRY}/{g}' for g in gone)}) and run install again")
    dest.mkdir(parents=True, exist_ok=True)
    wheel = dest / manifest["wheel"]
    with wheel.open("wb") as out:
        for part in manifest["parts"]:
            out.write((folder / part["name"]).read_bytes())
    if sha256(wheel) != manifest["sha256"]:
        raise SystemExit(f"gpu_carry: the reassembled {wheel.name} does not match its sha256")
    return wheel


def install(wheel: Path, target: Path) -> None:
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                    "--no-cache-dir", "--upgrade", "--target", str(target), str(wheel)], check=True)


def download(version: str, dest: Path) -> Path:
    """onnxruntime-gpu's wheel for the lent machine's Python 3.12 on x86-64 (docs: the device tool's README)."""
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
           "3.12", "--implementation", "cp", "-d", str(dest), f"onnxruntime-gpu=={version}"]
    for p in PLATFORMS:
        cmd += ["--platform", p]
    subprocess.run(cmd, check=True)
    found = sorted(dest.glob(f"onnxruntime_gpu-{version}-*.whl"))
    if not found:
        raise SystemExit(f"gpu_carry: pip downloaded no onnxruntime_gpu-{version} wheel into {dest}")
    return found[-1]


def exclude_carry_folder(root: Path) -> None:
    """Keep the parts out of git (they are carried by name, never committed)."""
    exclude = root / ".git" / "info" / "exclude"
    if not (root / ".git").is_dir():
        return
    exclude.parent.mkdir(parents=True, exist_ok=True)
    lines = exclude.read_text().splitlines() if exclude.exists() else []
    if f"/{CARRY}/" not in lines:
        exclude.write_text("\n".join([*lines, f"/{CARRY}/"]) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="verb", required=True)
    p = sub.add_parser("prepare", help="here: download (or take --wheel), split into parts, print the calls")
    p.add_argument("--wheel", type=Path, help="an onnxruntime-gpu wheel already here (default: download it)")
    p.add_argument("--version", default="1.31.1", help="onnxruntime-gpu version to download (default %(default)s)")
    p.add_argument("--part-mib", type=int, default=48,
                   help="part size in MiB (default %(default)s: a part and the tree fit one call's 64 MiB)")
    sub.add_parser("have", help="there: list the parts that arrived and those still missing")
    p = sub.add_parser("install", help="there: reassemble the wheel, check it, pip install it into --target")
    p.add_argument("--target", type=Path, default=Path("/tmp/site"))
    for s in sub.choices.values():
        s.add_argument("--dir", type=Path, default=ROOT / CARRY, help="the parts' folder (default %(default)s)")
    args = ap.parse_args(argv)
    folder: Path = args.dir
    if args.verb == "prepare":
        wheel = args.wheel or download(args.version, folder / "wheel")
        manifest = split(wheel, folder, args.part_mib << 20)
        if folder.resolve() == (ROOT / CARRY).resolve():
            exclude_carry_folder(ROOT)
        n = len(manifest["parts"])
        print(f"{wheel.name}: {manifest['bytes'] / 2**20:.0f} MiB in {n} parts under {folder}")
        print("the device calls, back to back (each names the manifest and one part in carry):")
        for part in manifest["parts"]:
            print(f"  carry [{CARRY}/carry.json, {CARRY}/{part['name']}]  command: python3 scripts/gpu_carry.py have")
        print("then the measurement call: scripts/gpu_check.sh (docs/deploy.md, \"The GPU check\")")
        return 0
    if not (folder / "carry.json").is_file():
        raise SystemExit(f"gpu_carry: no {folder}/carry.json here: carry {CARRY}/carry.json with the first part")
    if args.verb == "have":
        gone = missing(folder)
        total = len(json.loads((folder / "carry.json").read_text())["parts"])
        print(f"gpu_carry: {total - len(gone)} of {total} parts here" + (f"; missing: {' '.join(gone)}" if gone
                                                                          else "; complete"))
        return 0
    wheel = reassemble(folder, args.target.with_name(args.target.name + "-wheel"))
    install(wheel, args.target)
    print(f"gpu_carry: installed {wheel.name} into {args.target} (put it first on PYTHONPATH)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
