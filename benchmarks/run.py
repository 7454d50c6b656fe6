"""Entry point of ``make bench``: run every backend's benchmark, one after the other, on this machine.

Each benchmark writes its own results file: bench_dynamo -> benchmarks/RESULTS_DYNAMO.md, bench_onnx ->
benchmarks/RESULTS_ONNX.md (eager PyTorch and transformers' own exporter side by side in the same run), and so on for
each module named in BENCHES. Then ``summary.py`` puts the rows of all of them into one table,
benchmarks/RESULTS.md, with the roofline line and a chart (RESULTS.png). Arguments are passed on to every one of them,
e.g. ``python benchmarks/run.py --quick`` for a smoke run (no summary); ``--only onnx`` runs one (the summary is redone
from the results on disk). Exit status 1 when any export's greedy tokens differ from eager PyTorch's.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
# one module per backend, in the order they run; each has main(argv) -> exit status
BENCHES = ["bench_dynamo", "bench_onnx", "bench_executorch", "bench_quantized", "bench_openvino", "bench_aoti",
           "bench_prefill"]


def _ensure_hfexport_importable() -> None:
    # `make bench` runs with the package installed (pip install -e); from a bare checkout use ./src
    if importlib.util.find_spec("hfexport") is None:
        sys.path.insert(0, str(HERE.parent / "src"))


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    only = None
    if "--only" in argv:
        at = argv.index("--only")
        only = {f"bench_{name.removeprefix('bench_')}" for name in argv[at + 1].split(",")}
        del argv[at : at + 2]
        unknown = only - set(BENCHES)
        if unknown:
            print(f"unknown benchmark(s) {sorted(unknown)}; known: {BENCHES}", file=sys.stderr)
            return 2
    _ensure_hfexport_importable()
    sys.path.insert(0, str(HERE))
    status = 0
    for name in BENCHES:
        if only is None or name in only:
            print(f"[bench] ===== {name} =====", flush=True)
            # bench_quantized: its int8 decode-speed rows (the agreement table of every recipe takes hours: run
            # `python benchmarks/bench_quantized.py` alone)
            extra = ["--decode"] if name == "bench_quantized" else []
            status = max(status, importlib.import_module(name).main(argv + extra))
    if "--quick" not in argv:
        print("[bench] ===== summary =====", flush=True)
        status = max(status, importlib.import_module("summary").main([]))
    return status


if __name__ == "__main__":
    sys.exit(main())
