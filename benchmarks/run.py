"""Entry point of ``make bench``: run every benchmark and write benchmarks/RESULTS.md.

Today that is the Dynamo benchmark (benchmarks/bench_dynamo.py); arguments are passed on to it, e.g.
``python benchmarks/run.py --quick`` for a smoke run or ``--gqa-experiment`` for the extra static variant.
Exit status 1 when an export's greedy tokens differ from eager PyTorch's.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _ensure_hfexport_importable() -> None:
    # `make bench` runs with the package installed (pip install -e); from a bare checkout use ./src
    if importlib.util.find_spec("hfexport") is None:
        sys.path.insert(0, str(HERE.parent / "src"))


def main(argv: list[str] | None = None) -> int:
    _ensure_hfexport_importable()
    sys.path.insert(0, str(HERE))
    import bench_dynamo

    return bench_dynamo.main(argv)


if __name__ == "__main__":
    sys.exit(main())
