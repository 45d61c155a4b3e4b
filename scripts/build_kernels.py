#!/usr/bin/env python3
"""Emit and compile every configured CUTLASS int8 GEMM kernel into the cache (no GPU needed).

    python3 scripts/build_kernels.py --arch 75 80 90 -j 2
    CUTLASS_OPS_CACHE_DIR=/tmp/kernel-cache python3 scripts/build_kernels.py --arch 90 --epilogue none dequant

``--arch`` lists the GPUs' compute capabilities to build for (each gets every kernel generation
it can run: 90 -> Sm90 + Sm80 + Sm75 kernels). A second run is all cache hits; the GPU runtime
then loads kernels from the cache without compiling. The same as ``cutlass-ops build`` (the code
is :func:`cutlass_ops.cli.run_build`).
"""
from __future__ import annotations

import argparse
import sys

from cutlass_ops.cli import add_build_arguments, run_build


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_build_arguments(parser)
    return run_build(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
