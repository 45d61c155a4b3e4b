#!/usr/bin/env python3
"""Build a wheel that ships prebuilt kernels (no GPU needed; writes only into --out).

    python scripts/build_wheel.py --arch 75 80 86 89 90               # NVRTC cubins, then the wheel
    python scripts/build_wheel.py --arch 90 --cutlass -j 2            # + the shipped CUTLASS tiles (slow)
    python scripts/build_wheel.py --arch 80 --family gemv --out /tmp/w  # a subset, elsewhere

Steps, all in a temporary directory: copy the working tree (tracked and untracked-but-not-ignored
files, as they are on disk); compile into an empty staging cache the NVRTC modules of the default
kernel variants (``scripts/sanitize_kernels.py --build-only``'s modules, whose cases call the real
API, less the self-test kernels) for each arch's NVRTC target (90 -> 90a, as
``custom_kernels.device.target_arch``), and with ``--cutlass`` the configured CUTLASS kernels
(``cutlass-ops build``, needs the ``cutlass`` extra and nvcc); copy the verified entries with their
sha256 sidecars into the copy's ``custom_kernels/prebuilt/``; run ``pip wheel --no-deps`` on the
copy. The runtime uses a shipped cubin only when its key matches, i.e. the same sources, options,
target and NVRTC version (build with the nvidia-cuda-nvrtc the users will have); anything else is
compiled at first use as before.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts"
DEFAULT_ARCHS = ("75", "80", "86", "89", "90")
SELFTEST_FAMILIES = ("converters_test",)  # test-only kernels: not shipped
CUTLASS_FILES = ("kernel.cubin", "host.so", "meta.json")  # what the runtime loads (build.log etc. stay out)


def nvrtc_target(arch: str) -> str:
    """The NVRTC target the runtime compiles for on a GPU of compute capability ``arch``."""
    arch = arch.lower().removeprefix("sm_")
    return "90a" if arch == "90" else arch


def worktree_files(root: Path) -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                         capture_output=True, check=True).stdout.decode()
    return sorted({f for f in out.split("\0") if f and (root / f).is_file()})


def copy_tree(root: Path, dst: Path) -> Path:
    for rel in worktree_files(root):
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / rel, dst / rel)
    return dst


def _has_sidecar(path: Path) -> bool:
    import hashlib

    sidecar = path.with_name(path.name + ".sha256")
    return sidecar.is_file() and sidecar.read_text().strip() == hashlib.sha256(path.read_bytes()).hexdigest()


def _copy_verified(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(src, dst)
    shutil.copy2(src.with_name(src.name + ".sha256"), dst.with_name(dst.name + ".sha256"))


def collect(cache: Path, prebuilt: Path) -> tuple[int, int]:
    """Copy the staging cache's whole entries (sidecar matching) into ``prebuilt``; (cubins, CUTLASS kernels)."""
    cubins = 0
    for cubin in sorted((cache / "nvrtc").glob("*.cubin")):
        if _has_sidecar(cubin):
            _copy_verified(cubin, prebuilt / "nvrtc" / cubin.name)
            cubins += 1
    kernels = 0
    for entry in sorted((cache / "cutlass" / "index").glob("*.json")):
        name = json.loads(entry.read_text())["directory"]
        directory = cache / "cutlass" / "kernels" / name
        if not all((directory / f).is_file() and _has_sidecar(directory / f) for f in CUTLASS_FILES):
            print(f"skipping incomplete CUTLASS kernel {name}", file=sys.stderr)
            continue
        for f in CUTLASS_FILES:
            if not (prebuilt / "cutlass" / "kernels" / name / f).exists():
                _copy_verified(directory / f, prebuilt / "cutlass" / "kernels" / name / f)
        (prebuilt / "cutlass" / "index").mkdir(parents=True, exist_ok=True)
        shutil.copy2(entry, prebuilt / "cutlass" / "index" / entry.name)
        kernels += 1
    return cubins, kernels


def _run(cmd: list[str], cwd: Path, env: dict[str, str]) -> None:
    print("$ " + " ".join(cmd), file=sys.stderr, flush=True)
    subprocess.run(cmd, cwd=cwd, env=env, check=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", nargs="+", default=list(DEFAULT_ARCHS), help="GPU compute capabilities to ship")
    parser.add_argument("--cutlass", action="store_true", help="also the configured CUTLASS kernels (slow)")
    parser.add_argument("--family", nargs="+",
                        help="only these NVRTC kernel families (sanitize_kernels.py --family; default: all)")
    parser.add_argument("-j", "--jobs", type=int, default=max(1, min(16, os.cpu_count() or 1)))
    parser.add_argument("--out", type=Path, default=ROOT / "dist", help="where the wheel goes (default: dist/)")
    parser.add_argument("--build-isolation", action="store_true",
                        help="let pip fetch the build backend into an isolated environment (default: use this one)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory (printed)")
    args = parser.parse_args(argv)

    sys.path.insert(0, str(SCRIPTS))
    from sanitize_kernels import FAMILIES

    families = args.family or [f for f in FAMILIES if f not in SELFTEST_FAMILIES]
    stage = Path(tempfile.mkdtemp(prefix="cutlass-ops-wheel-"))
    try:
        src = copy_tree(ROOT, stage / "src")
        cache, prebuilt = stage / "cache", src / "custom_kernels" / "prebuilt"
        env = {**os.environ, "CUTLASS_OPS_CACHE_DIR": str(cache), "CUTLASS_OPS_PREBUILT_DIR": str(stage / "none"),
               "PYTHONPATH": os.pathsep.join([str(src), *filter(None, [os.environ.get("PYTHONPATH")])])}
        for target in dict.fromkeys(nvrtc_target(a) for a in args.arch):
            family_args = [a for f in families for a in ("--family", f)]
            _run([sys.executable, str(src / "scripts" / "sanitize_kernels.py"), "--build-only", "--arch", target,
                  "-j", str(args.jobs), *family_args], src, env)
        if args.cutlass:
            _run([sys.executable, str(src / "scripts" / "build_kernels.py"), "--arch", *args.arch, "--no-host-ext",
                  "-j", str(max(1, args.jobs // 2))], src, env)
        cubins, kernels = collect(cache, prebuilt)
        print(f"shipping {cubins} NVRTC cubins and {kernels} CUTLASS kernels", file=sys.stderr)
        args.out.mkdir(parents=True, exist_ok=True)
        wheel_dir = stage / "wheel"
        _run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "-q", "-w", str(wheel_dir),
              *([] if args.build_isolation else ["--no-build-isolation"])], stage, {**os.environ})
        (wheel,) = wheel_dir.glob("*.whl")
        shipped = [n for n in zipfile.ZipFile(wheel).namelist() if "/prebuilt/" in n and not n.endswith("README.md")]
        final = args.out / wheel.name
        shutil.move(str(wheel), final)
        print(f"{final} ({final.stat().st_size / 2**20:.1f} MiB, {len(shipped)} prebuilt files)")
    except subprocess.CalledProcessError as exc:
        print(f"FAILED (exit {exc.returncode}): {' '.join(map(str, exc.cmd))}", file=sys.stderr)
        return 1
    finally:
        if args.keep:
            print(f"kept {stage}", file=sys.stderr)
        else:
            shutil.rmtree(stage, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
