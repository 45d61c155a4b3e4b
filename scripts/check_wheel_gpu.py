#!/usr/bin/env python3
"""From the wheel alone, with no toolkit: every public op's first call, timed, with no compile and no process.

    python scripts/check_wheel_gpu.py dist/cutlass_ops-0.1.0-py3-none-any.whl --out /tmp/wheel_check.md
    python scripts/check_wheel_gpu.py WHEEL --env-only     # no GPU: only what the child process sees

Installs the wheel with ``pip install --no-deps --no-index --target <tmp>/site`` (its dependencies come
from the environment running this script: the target directory is first on PYTHONPATH), then runs a
fresh Python in which nothing can compile: PATH holds only a link to python (no nvcc, no host
compiler, no ninja), CUDA_HOME / CUDA_PATH / CXX / CC are unset, ``CUTLASS_OPS_CACHE_DIR`` is an empty
directory (only the shipped kernels exist), ``CUTLASS_OPS_PREBUILT_DIR`` is unset (the package's own
``prebuilt/``) and nvidia-cutlass cannot be imported (as without the ``cutlass`` extra). A ``sys.addaudithook`` hook records every process start (``subprocess.Popen``,
``os.system``, ``os.exec*``, ``os.posix_spawn``, ``os.spawn*``, ``os.fork``) with the Python frames
that asked for it.

After one tiny warm-up of CUDA itself (``torch.zeros(1, device="cuda")``) each public op runs once at
a representative shape (fp16, N = K = 1024), timed with ``torch.cuda.synchronize()`` on both sides,
then once more on a fresh shape (N doubled: a new weight / problem, the modules already loaded), so
a first call that is slow because of a one-time cost (torch's cuBLAS handle, a module import) shows
as such. A compile is any record of the library's build logs ("built <entry>", "compiled <file>",
"not in the shipped kernels: compiling", the C++ launch path's build) or any file appearing in the
user cache's ``nvrtc/`` / ``cutlass/kernels/`` / ``host_ext/``. Exit 1 when a first call takes more
than ``--limit-ms`` (50), a process was started after torch was imported and CUDA warmed up (those
before are torch's own; listed, not counted), anything compiled, an op failed, the package was not
imported from the wheel, or the wheel ships the C++ launch path for this Python and torch but it was
not the one loaded. The markdown report goes to stdout and to ``--out``.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
PACKAGES = ("cutlass_ops", "custom_kernels", "epilogues")
TOOLS = ("nvcc", "c++", "g++", "gcc", "cc", "clang", "clang++", "ninja", "ld")
DROPPED_ENV = ("CUDA_HOME", "CUDA_PATH", "CUDA_ROOT", "CUDACXX", "CXX", "CC", "CUTLASS_OPS_PREBUILT_DIR",
               "CUTLASS_OPS_CACHE_DIR", "CUTLASS_OPS_HOST_EXT", "PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")
SPAWN_EVENTS = frozenset({"subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
                          "os.forkpty", "pty.spawn"})
TORCH_PHASES = ("import torch", "CUDA warm-up")  # spawns here are torch's own: listed, not counted
COMPILE_LOG = re.compile(r"^(built |compiled |not in the shipped kernels|building the C\+\+ launch path)")
CACHE_ENTRIES = ("nvrtc/*.cubin", "cutlass/kernels/*", "host_ext/*/*.so")
K = 1024  # every problem's K; N = K at the first call, 2 K at the fresh-shape call
HIDDEN_MODULES = ("cutlass_cppgen", "cutlass_library")  # nvidia-cutlass (the extra that emits new kernels)


# ------------------------------------------------------------------------------------------------
# the child: runs in the stripped environment
# ------------------------------------------------------------------------------------------------

class Recorder:
    """Process starts (audit hook) and compile records (log handler), each tagged with the phase."""

    def __init__(self):
        self.phase = "startup"
        self.spawns: list[dict] = []
        self.compiles: list[dict] = []

    def audit(self, event: str, args) -> None:
        if event not in SPAWN_EVENTS:
            return
        try:
            argv = args[1] if event in ("subprocess.Popen", "os.exec", "os.posix_spawn") else args
            what = argv if isinstance(argv, (str, bytes)) else " ".join(map(str, argv))
            frames = [f for f in traceback.extract_stack()[:-1] if Path(f.filename).name != "subprocess.py"]
            where = " < ".join(f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in reversed(frames[-8:]))
        except Exception as exc:  # an audit hook must never raise
            what, where = f"{event} {args!r}", f"(no stack: {exc})"
        self.spawns.append({"phase": self.phase, "event": event, "what": what[:300], "where": where})

    def log_handler(self):
        import logging

        recorder = self

        class Handler(logging.Handler):
            def emit(self, record):
                message = record.getMessage()
                if COMPILE_LOG.match(message):
                    recorder.compiles.append({"phase": recorder.phase, "logger": record.name, "message": message[:300]})

        return Handler(logging.INFO)


def _cache_entries(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for pattern in CACHE_ENTRIES for p in root.glob(pattern)}


def _cases(torch, ops):
    """(name, make) pairs; make(variant) prepares the inputs (untimed) and returns the call to time.
    variant 0: N = K; variant 1: the fresh shape, N = 2 K."""
    import epilogues
    from cutlass_ops import nn as qnn

    def n_of(variant):
        return K * (1 + variant)

    def weight(variant, bits, symmetric=True):
        w = torch.randn(n_of(variant), K)
        return ops.quantize_weight(w, bits=bits, block_size=128, symmetric=symmetric).to("cuda")

    def x_of(M):
        return torch.randn(M, K).half().cuda()

    def quantize_weight(variant):
        w = torch.randn(n_of(variant), K).half().cuda()
        return lambda: ops.quantize_weight(w, bits=4, block_size=128)

    def linear(bits, M):
        def make(variant):
            qw, x = weight(variant, bits), x_of(M)
            return lambda: ops.linear(x, qw)
        return make

    def quantize_activation(variant):
        x = torch.randn(64, n_of(variant)).half().cuda()
        return lambda: ops.quantize_activation(x, 128)

    def linear_w8a8(path, M):
        def make(variant):
            qw, x = weight(variant, 8, symmetric=False), x_of(M)
            return lambda: ops.linear_w8a8(x, qw, path=path)
        return make

    def int8_gemm(epilogue):
        spec = epilogues.get(epilogue)

        def make(variant):
            M, N = 64, n_of(variant)
            A = torch.randint(-128, 128, (M, K), dtype=torch.int8).cuda()
            B = torch.randint(-128, 128, (N, K), dtype=torch.int8).cuda()
            inputs = {}
            for name, kind in spec.inputs:
                if kind == "scalar":
                    inputs[name] = {"lo": -100.0, "hi": 100.0}.get(name, 1.0)
                elif name == "fused_bias":
                    inputs[name] = torch.randint(-3000, 3000, (N,)).float().cuda()
                elif kind == "matrix":
                    inputs[name] = torch.randn(M, N).cuda()
                else:
                    inputs[name] = (torch.rand(M if kind == "per_row" else N) * 1e-3 + 1e-4).cuda()
            return lambda: ops.int8_gemm(A, B, epilogue, **inputs)
        return make

    def int8_gemm_requant(variant):
        N = n_of(variant)
        A = torch.randint(-128, 128, (64, K), dtype=torch.int8).cuda()
        W = torch.randint(-128, 128, (N, K), dtype=torch.int8).cuda()
        M_scale, bias = (torch.rand(N) * 1e-3 + 1e-4).cuda(), torch.randint(-3000, 3000, (N,)).float().cuda()
        return lambda: ops.int8_gemm_requant(A, W, M_scale, bias)

    def conv2d(bits):
        def make(variant):
            qw = ops.quantize_conv_weight(torch.randn(64 * (1 + variant), 64, 3, 3), bits=bits, block_size=64)
            qw, x = qw.to("cuda"), torch.randn(1, 64, 28, 28).half().cuda()
            return lambda: ops.conv2d(x, qw, stride=1, padding=1)
        return make

    def quant_linear(config, M):
        def make(variant):
            module = qnn.QuantLinear.from_float(torch.nn.Linear(K, n_of(variant)).half(), config).cuda()
            x = x_of(M)
            return lambda: module(x)
        return make

    def quant_conv2d(variant):
        conv = torch.nn.Conv2d(64, 64 * (1 + variant), 3, padding=1).half()
        module = qnn.QuantConv2d.from_float(conv, ops.WeightOnlyConfig(bits=4, block_size=64)).cuda()
        x = torch.randn(1, 64, 28, 28).half().cuda()
        return lambda: module(x)

    cases = [("quantize_weight (int4, CUDA tensor)", quantize_weight)]
    for bits in (4, 8):
        for M in (1, 64):
            cases.append((f"linear W{bits}A16 M={M}", linear(bits, M)))
    cases.append(("quantize_activation M=64 (block 128)", quantize_activation))
    for path in ops.W8A8_PATHS:
        cases.append((f"linear_w8a8 {path} M=64", linear_w8a8(path, 64)))
    cases.append(("linear_w8a8 fused M=256", linear_w8a8("fused", 256)))
    for epilogue in epilogues.names():
        cases.append((f"int8_gemm {epilogue} M=64", int8_gemm(epilogue)))
    cases.append(("int8_gemm_requant M=64", int8_gemm_requant))
    for bits in (4, 8):
        cases.append((f"conv2d int{bits} 64->64 3x3, 1x64x28x28", conv2d(bits)))
    cases += [("QuantLinear weight_only int4 M=1", quant_linear(ops.WeightOnlyConfig(bits=4), 1)),
              ("QuantLinear w8a8_block M=64", quant_linear(ops.W8A8BlockConfig(), 64)),
              ("QuantLinear w8a8_channel M=64", quant_linear(ops.W8A8ChannelConfig(), 64)),
              ("QuantConv2d int4 64->64 3x3", quant_conv2d)]
    return cases


def _timed(torch, call) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    call()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3


def child(config: dict) -> dict:
    """Runs in the stripped environment; returns what it saw (written as JSON by the caller)."""
    recorder = Recorder()
    sys.addaudithook(recorder.audit)
    for name in HIDDEN_MODULES:  # as without the ``cutlass`` extra: a kernel not shipped fails, naming the extra
        sys.modules[name] = None
    result: dict = {"rows": [], "errors": []}
    cache_root = Path(config["cache"])
    result["cache_empty_before"] = not any(cache_root.rglob("*"))
    result["tools"] = {t: shutil.which(t) for t in TOOLS}
    result["env"] = {k: os.environ.get(k) for k in ("CUDA_HOME", "CUDA_PATH", "CXX", "CC", "PATH")}

    recorder.phase = "import torch"
    import logging

    import torch

    for name in ("custom_kernels", "cutlass_ops"):
        logging.getLogger(name).setLevel(logging.INFO)
        logging.getLogger(name).addHandler(recorder.log_handler())
    result["torch"], result["python"] = torch.__version__, sys.version.split()[0]

    if not config["env_only"]:
        recorder.phase = "CUDA warm-up"
        torch.zeros(1, device="cuda")
        torch.cuda.synchronize()
        result["device"] = f"{torch.cuda.get_device_name()} (sm_{''.join(map(str, torch.cuda.get_device_capability()))})"

    recorder.phase = "import cutlass_ops"
    t0 = time.perf_counter()
    import cutlass_ops as ops
    import custom_kernels
    import epilogues
    from custom_kernels import cache, host_ext
    from cutlass_ops.cli import count_entries

    result["import_ms"] = (time.perf_counter() - t0) * 1e3
    result["modules"] = {m.__name__: m.__file__ for m in (ops, custom_kernels, epilogues)}
    result["prebuilt"] = f"{cache.prebuilt_root()} ({count_entries(cache.prebuilt_root())})"
    result["host_ext_tag"] = host_ext.prebuilt_tag()
    result["host_ext_shipped"] = (cache.prebuilt_root() / "host_ext" / host_ext.prebuilt_tag()).is_dir()

    if config["env_only"]:  # no GPU: load (not launch) the C++ launch path the way load() does
        recorder.phase = "C++ launch path"
        try:
            _, result["host_ext_origin"] = host_ext._load_or_build()
        except Exception as exc:  # noqa: BLE001 - reported
            result["host_ext_origin"] = f"unavailable ({type(exc).__name__}: {exc})"
    else:
        with torch.no_grad():
            for name, make in _cases(torch, ops):
                row = {"op": name}
                for column, variant in (("first_ms", 0), ("fresh_ms", 1)):
                    recorder.phase = f"prepare {name}"
                    try:
                        call = make(variant)
                        recorder.phase = name
                        before = _cache_entries(cache_root)
                        row[column] = _timed(torch, call)
                        row.setdefault("new_entries", []).extend(sorted(_cache_entries(cache_root) - before))
                    except Exception as exc:  # noqa: BLE001 - every op is reported
                        row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
                        result["errors"].append(f"{name}: {traceback.format_exc()[-2000:]}")
                        break
                result["rows"].append(row)
        recorder.phase = "report"
        result["host_ext_origin"] = host_ext.origin or f"not loaded ({host_ext._failed or 'never asked'})"
    result["host_ext_describe"] = host_ext.describe()  # after the ops: its checks would warm their first call
    result["spawns"], result["compiles"] = recorder.spawns, recorder.compiles
    result["cache_entries_after"] = sorted(_cache_entries(cache_root))
    return result


# ------------------------------------------------------------------------------------------------
# the parent: install, strip the environment, run the child, judge and report
# ------------------------------------------------------------------------------------------------

def stripped_env(bindir: Path, site: Path, cache: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in DROPPED_ENV}
    bindir.mkdir(parents=True, exist_ok=True)
    for name in ("python", "python3"):
        (bindir / name).symlink_to(sys.executable)
    env.update(PATH=str(bindir), PYTHONPATH=str(site), CUTLASS_OPS_CACHE_DIR=str(cache), PYTHONDONTWRITEBYTECODE="1")
    return env


def judge(result: dict, site: Path, limit_ms: float, env_only: bool) -> list[str]:
    """The reasons the check fails (empty: it passes)."""
    failures = []
    for name, path in result["modules"].items():
        if not Path(path).resolve().is_relative_to(site.resolve()):
            failures.append(f"{name} was imported from {path}, not from the wheel")
    found = [f"{t} ({p})" for t, p in result["tools"].items() if p]
    if found:
        failures.append(f"on PATH in the child: {', '.join(found)}")
    if not result["cache_empty_before"]:
        failures.append("the user cache was not empty at the start")
    counted = [s for s in result["spawns"] if s["phase"] not in TORCH_PHASES]
    if counted:
        failures.append(f"{len(counted)} process(es) started after torch was imported")
    if result["compiles"] or result["cache_entries_after"]:
        failures.append(f"compiled: {len(result['compiles'])} build log records, "
                        f"{len(result['cache_entries_after'])} new cache entries")
    if result["host_ext_shipped"] and not str(result.get("host_ext_origin", "")).startswith("shipped "):
        failures.append(f"the wheel ships the C++ launch path for {result['host_ext_tag']} but it was not used: "
                        f"{result.get('host_ext_origin')}")
    if env_only:
        return failures
    for row in result["rows"]:
        if "error" in row:
            failures.append(f"{row['op']} failed: {row['error']}")
        elif row["first_ms"] > limit_ms:
            failures.append(f"{row['op']}: first call {row['first_ms']:.1f} ms > {limit_ms:g} ms")
    return failures


def report(result: dict, wheel: Path, site: Path, limit_ms: float, failures: list[str], env_only: bool) -> str:
    lines = [f"# Wheel check: {wheel.name}", ""]
    lines.append(f"- device: {result.get('device', 'not used (--env-only)')}; python {result['python']}, "
                 f"torch {result['torch']}")
    lines.append(f"- imported from the wheel's install directory {site}: "
                 + ", ".join(f"{m} ({'yes' if Path(p).resolve().is_relative_to(site.resolve()) else p})"
                             for m, p in result["modules"].items()) + f"; import {result['import_ms']:.0f} ms")
    lines.append(f"- shipped: {result['prebuilt']}")
    lines.append(f"- C++ launch path ({result['host_ext_tag']}): {result['host_ext_describe']}; "
                 f"loaded: {result.get('host_ext_origin')}")
    absent = [t for t, p in result["tools"].items() if not p]
    lines.append(f"- PATH: {result['env']['PATH']} (python only; not found: {', '.join(absent)}); "
                 f"CUDA_HOME, CUDA_PATH, CXX, CC unset; {', '.join(HIDDEN_MODULES)} hidden; user cache empty at the start: "
                 f"{'yes' if result['cache_empty_before'] else 'NO'}")
    if not env_only:
        lines += ["", f"First call of each public op (fp16, K = {K}; limit {limit_ms:g} ms), after "
                      "`torch.zeros(1, device=\"cuda\")`; \"fresh shape\": the same op right after, N doubled "
                      "(new weight or problem, modules loaded).", "",
                  "| op | first call ms | fresh shape ms | compiled? | processes started |", "|---|---|---|---|---|"]
        for row in result["rows"]:
            compiled = [c for c in result["compiles"] if c["phase"] == row["op"]] or row.get("new_entries")
            spawned = sum(s["phase"] == row["op"] for s in result["spawns"])
            if "error" in row:
                first, fresh = f"FAILED: {row['error']}", ""
            else:
                first = f"{row['first_ms']:.1f}" + (" **(over)**" if row["first_ms"] > limit_ms else "")
                fresh = f"{row['fresh_ms']:.1f}" if "fresh_ms" in row else ""
            lines.append(f"| {row['op']} | {first} | {fresh} | {'**yes**' if compiled else 'no'} | {spawned} |")
    torch_spawns = [s for s in result["spawns"] if s["phase"] in TORCH_PHASES]
    if torch_spawns:
        lines += ["", "Processes started by torch itself (import, CUDA init), not counted:"]
        lines += [f"- {s['phase']}: `{s['what']}`" for s in torch_spawns]
    counted = [s for s in result["spawns"] if s["phase"] not in TORCH_PHASES]
    if counted:
        lines += ["", "Processes started (counted):"]
        lines += [f"- {s['phase']}: {s['event']} `{s['what']}` from {s['where']}" for s in counted]
    if result["compiles"]:
        lines += ["", "Build log records:"] + [f"- {c['phase']}: {c['logger']}: {c['message']}" for c in result["compiles"]]
    if result["cache_entries_after"]:
        lines += ["", "User cache entries written:"] + [f"- {e}" for e in result["cache_entries_after"]]
    lines += ["", f"**{'FAIL' if failures else 'PASS'}**" + ("" if not failures else ":")]
    lines += [f"- {f}" for f in failures]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("wheel", type=Path, nargs="?", help="the .whl to check")
    parser.add_argument("--out", type=Path, help="also write the markdown report here")
    parser.add_argument("--limit-ms", type=float, default=50.0, help="the most a first call may take (default 50)")
    parser.add_argument("--env-only", action="store_true",
                        help="no GPU: check only the child's environment, the imports and the C++ launch path")
    parser.add_argument("--timeout", type=int, default=600, help="seconds the child may run")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory (printed)")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)  # internal: the config of the child run
    args = parser.parse_args(argv)

    if args.child is not None:  # inside the stripped environment: the checkout's scripts/ stays off sys.path
        sys.path[:] = [p for p in sys.path if Path(p or os.getcwd()).resolve() != HERE]
        config = json.loads(args.child.read_text())
        Path(config["result"]).write_text(json.dumps(child(config), indent=1))
        return 0
    if args.wheel is None or not args.wheel.is_file():
        parser.error("give the path of a built wheel (scripts/build_wheel.py writes one to dist/)")

    tmp = Path(tempfile.mkdtemp(prefix="cutlass-ops-wheel-check-"))
    try:
        site, cache, cwd = tmp / "site", tmp / "cache", tmp / "cwd"
        cache.mkdir()
        cwd.mkdir()
        pip = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q", "--target",
                              str(site), str(args.wheel)], capture_output=True, text=True)
        if pip.returncode:
            print(f"pip install failed:\n{pip.stdout}{pip.stderr}", file=sys.stderr)
            return 1
        config = {"cache": str(cache), "env_only": args.env_only, "result": str(tmp / "result.json")}
        (tmp / "config.json").write_text(json.dumps(config))
        proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", str(tmp / "config.json")],
                              cwd=cwd, env=stripped_env(tmp / "bin", site, cache), capture_output=True, text=True,
                              timeout=args.timeout)
        if proc.returncode or not (tmp / "result.json").is_file():
            print(f"the check's child process failed (exit {proc.returncode}):\n{proc.stdout[-4000:]}"
                  f"{proc.stderr[-8000:]}", file=sys.stderr)
            return 1
        result = json.loads((tmp / "result.json").read_text())
        failures = judge(result, site, args.limit_ms, args.env_only)
        text = report(result, args.wheel, site, args.limit_ms, failures, args.env_only)
        print(text)
        for error in result["errors"]:
            print(error, file=sys.stderr)
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(text)
        return 1 if failures else 0
    finally:
        if args.keep:
            print(f"kept {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
