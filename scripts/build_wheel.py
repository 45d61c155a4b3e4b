#!/usr/bin/env python3
"""Build a wheel that ships prebuilt kernels (no GPU needed; writes only into --out).

    python scripts/build_wheel.py --arch 75 80 86 89 90               # NVRTC cubins, then the wheel
    python scripts/build_wheel.py --arch 90 --cutlass -j 2            # + the shipped CUTLASS tiles (slow)
    python scripts/build_wheel.py --arch 90 --cutlass --from-cache "$CUTLASS_OPS_CACHE_DIR" --host-ext
                                                                      # copy them from a filled cache instead
    python scripts/build_wheel.py --arch 80 --family gemv --out /tmp/w  # a subset, elsewhere

Steps, all in a temporary directory: copy the working tree (tracked and untracked-but-not-ignored
files, as they are on disk); for each arch's NVRTC target (90 -> 90a, as
``custom_kernels.device.target_arch``) compile into an empty staging cache every NVRTC module the
default dispatch of the public ops can load on that arch (``cutlass_ops.default_variants``: each
strategy, kernel variant and block-size-dependent build the dispatch can pick at any M and shape),
together with the modules of ``scripts/sanitize_kernels.py --build-only``'s cases that can run there
(they force strategies and configs for coverage), less the self-test kernels
(``scripts/wheel_manifest.py nvrtc``); with ``--cutlass`` the configured CUTLASS kernels of
``tuning/default.json`` and of every ``tuning/<gpu>.json`` (``cutlass-ops build``, needs the
``cutlass`` extra and nvcc); copy the verified entries (sha256 sidecar matching) with their
sidecars into the copy's ``custom_kernels/prebuilt/``; run ``pip wheel --no-deps`` on the copy.
``scripts/wheel_manifest.py`` names the entries, so only those the runtime looks up are shipped.

``--from-cache DIR`` (a ``$CUTLASS_OPS_CACHE_DIR`` of this machine, read only): the NVRTC cubins and
CUTLASS kernels it already has are copied from it instead of compiled (NVRTC modules it lacks are
compiled, each printed with its time; CUTLASS kernels it lacks are listed and left out);
``scripts/sanitize_kernels.py --build-only --default-variants`` fills a cache with every NVRTC module
this script ships. With ``--all-cached`` also every other cubin (and, with ``--cutlass``, CUTLASS
kernel) it holds for the archs, i.e. whatever the GPU's runs compiled that the set above does not
name. ``--host-ext``: also ship the C++ launch path (``custom_kernels/host_ext.py``) built for the
Python and torch running this script, under ``prebuilt/host_ext/<cpXY>-torch<version>/`` (taken from
``--from-cache`` when it has this build, else compiled: needs a host C++ compiler and ninja); other
Pythons / torch builds fall back to building it or to the Python launch path.

The runtime uses a shipped cubin only when its key matches, i.e. the same sources, options, target
and NVRTC version (build with the nvidia-cuda-nvrtc the users will have); anything else is compiled
at first use as before.
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
CUTLASS_FILES = ("kernel.cubin", "host.so", "meta.json")  # what the runtime loads (build.log etc. stay out)


def nvrtc_target(arch: str) -> str:
    """The NVRTC target the runtime compiles for on a GPU of compute capability ``arch``."""
    arch = arch.lower().removeprefix("sm_")
    return "90a" if arch == "90" else arch


WHEEL_INPUTS = ("pyproject.toml", "README.md", "cutlass_ops", "custom_kernels", "epilogues", "scripts")


def worktree_files(root: Path) -> list[str]:
    """Tracked and untracked-but-not-ignored files; outside a git checkout (a copy of the tree without
    .git), what the wheel and this script's steps read: WHEEL_INPUTS without byte code."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                             capture_output=True, check=True).stdout.decode()
        return sorted({f for f in out.split("\0") if f and (root / f).is_file()})
    except (OSError, subprocess.CalledProcessError):
        files = [p for name in WHEEL_INPUTS for p in ([root / name] if (root / name).is_file()
                                                       else (root / name).rglob("*"))]
        return sorted(p.relative_to(root).as_posix() for p in files if p.is_file() and "__pycache__" not in p.parts
                      and p.suffix not in (".pyc", ".so", ".cubin") and not p.name.endswith(".egg-info"))


def copy_tree(root: Path, dst: Path) -> Path:
    for rel in worktree_files(root):
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / rel, dst / rel)
    return dst


def _has_sidecar(path: Path) -> bool:
    import hashlib

    sidecar = path.with_name(path.name + ".sha256")
    return (path.is_file() and sidecar.is_file()
            and sidecar.read_text().strip() == hashlib.sha256(path.read_bytes()).hexdigest())


def _copy_verified(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(src, dst)
    shutil.copy2(src.with_name(src.name + ".sha256"), dst.with_name(dst.name + ".sha256"))


def _indexed_directory(root: Path, index_key: str) -> Path | None:
    """The kernel directory that ``root``'s CUTLASS index entry ``index_key`` names (as the runtime reads it)."""
    try:
        name = json.loads((root / "cutlass" / "index" / f"{index_key}.json").read_text())["directory"]
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        return None
    return root / "cutlass" / "kernels" / name if isinstance(name, str) and Path(name).name == name else None


def collect(roots: list[Path], prebuilt: Path, cubins: list[str], kernels: dict[str, str]) -> tuple[int, list[str]]:
    """Copy the named entries into ``prebuilt``, each from the first of ``roots`` (cache directories)
    where it is whole and verified: the NVRTC ``cubins`` (file names; every one must be found) and the
    CUTLASS ``kernels`` ({index key: name}). (cubins copied, names of the CUTLASS kernels not found)."""
    for name in cubins:
        src = next((r / "nvrtc" / name for r in roots if _has_sidecar(r / "nvrtc" / name)), None)
        if src is None:
            raise FileNotFoundError(f"NVRTC cubin {name} is in none of {', '.join(map(str, roots))}")
        _copy_verified(src, prebuilt / "nvrtc" / name)
    missing = []
    for index_key, name in kernels.items():
        for root in roots:
            directory = _indexed_directory(root, index_key)
            if directory is not None and all(_has_sidecar(directory / f) for f in CUTLASS_FILES):
                for f in CUTLASS_FILES:
                    _copy_verified(directory / f, prebuilt / "cutlass" / "kernels" / directory.name / f)
                (prebuilt / "cutlass" / "index").mkdir(parents=True, exist_ok=True)
                shutil.copy2(root / "cutlass" / "index" / f"{index_key}.json",
                             prebuilt / "cutlass" / "index" / f"{index_key}.json")
                break
        else:
            missing.append(name)
    return len(cubins), missing


def everything_cached(root: Path, archs: list[str]) -> tuple[list[str], dict[str, str]]:
    """Every NVRTC cubin and indexed CUTLASS kernel of cache ``root`` for GPUs of ``archs`` (whatever the
    GPU runs compiled, stale keys included): (cubin names, {index key: kernel directory name})."""
    targets = {nvrtc_target(a) for a in archs}
    cubins = sorted(p.name for t in targets for p in (root / "nvrtc").glob(f"*-sm{t}-*.cubin"))
    device_ccs = {a.lower().removeprefix("sm_") for a in archs}
    kernels = {}
    for entry in sorted((root / "cutlass" / "index").glob("*.json")):
        try:
            target = str(json.loads(entry.read_text())["spec"]["target_arch"])
        except (ValueError, KeyError, TypeError):
            continue
        if target.rstrip("a") in device_ccs:
            kernels[entry.stem] = entry.stem
    return cubins, kernels


def _run(cmd: list[str], cwd: Path, env: dict[str, str]) -> None:
    print("$ " + " ".join(cmd), file=sys.stderr, flush=True)
    subprocess.run(cmd, cwd=cwd, env=env, check=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", nargs="+", default=list(DEFAULT_ARCHS), help="GPU compute capabilities to ship")
    parser.add_argument("--cutlass", action="store_true", help="also the configured CUTLASS kernels (slow)")
    parser.add_argument("--from-cache", type=Path, metavar="DIR",
                        help="copy the kernels this cache directory already has instead of compiling them")
    parser.add_argument("--all-cached", action="store_true",
                        help="with --from-cache: also every other cubin / CUTLASS kernel it holds for --arch")
    parser.add_argument("--host-ext", action="store_true",
                        help="also the C++ launch path, built for this Python and torch")
    parser.add_argument("--family", nargs="+",
                        help="only these NVRTC kernel families (sanitize_kernels.py --family; default: all)")
    parser.add_argument("-j", "--jobs", type=int, default=max(1, min(16, os.cpu_count() or 1)))
    parser.add_argument("--out", type=Path, default=ROOT / "dist", help="where the wheel goes (default: dist/)")
    parser.add_argument("--build-isolation", action="store_true",
                        help="let pip fetch the build backend into an isolated environment (default: use this one)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory (printed)")
    args = parser.parse_args(argv)
    from_cache = args.from_cache.expanduser().resolve() if args.from_cache else None
    if from_cache is not None and not from_cache.is_dir():
        parser.error(f"--from-cache {args.from_cache}: no such directory")
    if args.all_cached and from_cache is None:
        parser.error("--all-cached needs --from-cache")

    stage = Path(tempfile.mkdtemp(prefix="cutlass-ops-wheel-"))
    try:
        src = copy_tree(ROOT, stage / "src")
        cache, prebuilt, manifest = stage / "cache", src / "custom_kernels" / "prebuilt", stage / "manifest"
        manifest.mkdir()
        env = {**os.environ, "CUTLASS_OPS_CACHE_DIR": str(cache), "CUTLASS_OPS_PREBUILT_DIR": str(stage / "none"),
               "PYTHONPATH": os.pathsep.join([str(src), *filter(None, [os.environ.get("PYTHONPATH")])])}
        # --from-cache: the runtime's own lookup finds its entries (same layout as a prebuilt tree, read only)
        lookup_env = {**env, "CUTLASS_OPS_PREBUILT_DIR": str(from_cache)} if from_cache else env
        tool = [sys.executable, str(src / "scripts" / "wheel_manifest.py")]
        families = [a for f in args.family for a in ("--family", f)] if args.family else []
        cubins: list[str] = []
        for target in dict.fromkeys(nvrtc_target(a) for a in args.arch):
            out = manifest / f"nvrtc-{target}.json"
            _run([*tool, "nvrtc", "--arch", target, "-j", str(args.jobs), *families, "--out", str(out)], src,
                 lookup_env)
            cubins += json.loads(out.read_text())
        kernels: dict[str, str] = {}
        if args.cutlass:
            _run([*tool, "cutlass", "--arch", *args.arch, "--out", str(manifest / "cutlass.json")], src, env)
            configured = json.loads((manifest / "cutlass.json").read_text())
            kernels = configured["kernels"]
            if from_cache is None:
                for gpu_name in configured["gpu_names"]:  # the default tiles, then each tuned GPU's
                    _run([sys.executable, str(src / "scripts" / "build_kernels.py"), "--arch", *args.arch,
                          "--no-host-ext", "-j", str(max(1, args.jobs // 2)),
                          *(["--gpu-name", gpu_name] if gpu_name else [])], src, env)
        if args.host_ext:
            _run([*tool, "host-ext", "--prebuilt", str(prebuilt),
                  *(["--from-cache", str(from_cache)] if from_cache else [])], src, env)
        roots = [cache, *([from_cache] if from_cache else [])]
        if args.all_cached:
            extra_cubins, extra_kernels = everything_cached(from_cache, args.arch)
            cubins += extra_cubins
            if args.cutlass:
                kernels = {**extra_kernels, **kernels}
        n_cubins, missing = collect(roots, prebuilt, list(dict.fromkeys(cubins)), kernels)
        if n_cubins:  # the NVRTC they were built with: a fresh user cache then need not load NVRTC to key them
            record = subprocess.run([sys.executable, "-c", "import json; from custom_kernels.nvrtc import "
                                     "shipped_version_record as r; print(json.dumps(r()))"],
                                    cwd=src, env=env, check=True, capture_output=True, text=True).stdout
            (prebuilt / "nvrtc" / "version.json").write_text(record.strip().splitlines()[-1] + "\n")
        print(f"shipping {n_cubins} NVRTC cubins and {len(kernels) - len(missing)} of {len(kernels)} configured "
              f"CUTLASS kernels" + (", the C++ launch path" if args.host_ext else ""), file=sys.stderr)
        if missing:
            print(f"WARNING: {len(missing)} configured CUTLASS kernels are not in {from_cache or cache} and not "
                  f"shipped (first use compiles them; `cutlass-ops build --arch {' '.join(args.arch)} "
                  f"[--gpu-name NAME]` fills the cache): {', '.join(sorted(missing))}", file=sys.stderr)
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
    except FileNotFoundError as exc:
        print(f"FAILED: {exc}", file=sys.stderr)
        return 1
    finally:
        if args.keep:
            print(f"kept {stage}", file=sys.stderr)
        else:
            shutil.rmtree(stage, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
