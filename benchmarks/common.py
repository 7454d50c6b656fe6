"""What every backend benchmark does the same way: export in a child process, timed generation in interleaved
rounds, the results table's cells, and a memory-bandwidth roofline.

- Export: ``measure_export`` runs in the child (``--export-child``): loads SmolLM2-135M, exports it, saves it, and
  returns the record (wall times, peak RSS from ``getrusage``, bytes on disk, the model's weight bytes);
  ``run_export_child`` starts that child from the parent and reads the record back from its last stdout line.
- Generation: ``timed_generate`` times one greedy ``generate`` with the ``TimingStreamer`` that ``hfexport run`` uses
  (prefill = call to the first new token; decode tok/s = (new tokens - 1) / (first to last new token));
  ``interleaved_rounds`` runs every runner once per round, eager first, and ``summarise`` keeps the best round and
  checks every round's tokens against eager's.
- ``TimedMethod`` records the seconds spent inside one method of a wrapped object (``run_with_iobinding`` of an ONNX
  Runtime session, ``execute`` of an ExecuTorch method): a decode step's wall time minus that is the per-step overhead.
- Roofline: ``memory_bandwidth`` measures this machine's copy bandwidth; ``decode_bound`` is the decode speed that
  bandwidth allows when every token reads every weight once.

benchmarks/ is on ``sys.path`` (the running script's folder, or put there by run.py): ``import common``.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
PROMPT = "Once upon a time, in a small village at the edge of a great forest, there lived"
SAMPLE = "Hello, world!"
STATIC_CACHE_LEN = 256
EAGER_LABEL = "eager `model.generate` (dynamic cache)"

Runner = Callable[[int], "tuple[list[int], dict]"]  # new tokens -> (new token ids, timing stats)


def ensure_importable() -> None:
    """Make ``import hfexport`` work from a bare checkout (``make bench`` has it installed)."""
    try:
        import hfexport  # noqa: F401
    except ImportError:
        sys.path.insert(0, str(REPO / "src"))


def static_generation_config(model: Any, max_cache_len: int = STATIC_CACHE_LEN) -> Any:
    """Greedy ``model.generation_config`` with a static cache of ``max_cache_len``."""
    gen = copy.deepcopy(model.generation_config)
    gen.cache_implementation, gen.max_cache_len, gen.do_sample = "static", max_cache_len, False
    return gen


# backends whose generation recipe keeps the model's growing cache: OpenVINO's stateful IR, which the CPU plugin fuses
# into its stateful attention (bench_openvino.py's first row); the others take a static cache
GROWING_CACHE = ("openvino",)


def recipe_generation_config(backend: str, model: Any, max_cache_len: int = STATIC_CACHE_LEN) -> Any:
    """The generation config of ``backend``'s recommended recipe: ``None`` (the model's own, growing cache) for
    :data:`GROWING_CACHE`, else :func:`static_generation_config`."""
    return None if backend in GROWING_CACHE else static_generation_config(model, max_cache_len)


def ort_session_options(threads: int | None) -> Any:
    """ONNX Runtime session options with ``threads`` intra-op threads (None: ONNX Runtime's default)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    if threads is not None:
        options.intra_op_num_threads = threads
    return options


# --- export, in a child process of its own ---------------------------------------------------------------------------


def peak_rss() -> int:
    """This process's peak resident set size so far, in bytes: ``VmHWM`` of /proc/self/status. Not
    ``getrusage``'s ``ru_maxrss``, which Linux carries over ``fork`` + ``exec``: an export child of a parent that
    already holds a model would report the parent's peak (seen: every export of one ``make bench`` run at 2736 MB)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def weight_bytes(model: Any) -> int:
    """Bytes of ``model``'s parameters, tied weights counted once."""
    return sum({p.data_ptr(): p.numel() * p.element_size() for p in model.parameters()}.values())


def folder_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


def top_files(directory: Path) -> dict[str, int]:
    """Name -> bytes of the files directly in ``directory``."""
    return {p.name: p.stat().st_size for p in directory.iterdir() if p.is_file()}


def measure_export(variant: str, out: Path, export: Callable[[Any, dict], Any]) -> tuple[dict, Any]:
    """In the export child: SmolLM2-135M exported by ``export(model, sample)`` and saved to ``out``.

    Returns the record (``variant``, ``export_s``, ``save_s``, ``peak_rss``, ``bytes``, ``files``, ``weight_bytes``;
    the peak RSS is taken after the save) and the exported model, for a caller that records more.
    """
    from hfexport.testing.packaged import packaged

    model, tokenizer = packaged("smollm2")
    sample = dict(tokenizer([SAMPLE], return_tensors="pt"))
    start = time.perf_counter()
    exported = export(model, sample)
    export_s = time.perf_counter() - start
    start = time.perf_counter()
    exported.save_pretrained(out)
    save_s = time.perf_counter() - start
    record = {
        "variant": variant,
        "export_s": export_s,
        "save_s": save_s,
        "peak_rss": peak_rss(),
        "bytes": folder_bytes(out),
        "files": top_files(out),
        "weight_bytes": weight_bytes(model),
    }
    return record, exported


def run_export_child(script: str | Path, variant: str, out: Path, what: str = "export", timeout: int = 1800,
                     keep_going: bool = False) -> dict:
    """Run ``script --export-child variant --out out`` and return the record its last stdout line holds.

    A failed child raises ``RuntimeError`` (``what`` names the export in the message), or with ``keep_going`` returns
    ``{"variant": variant, "error": <the last line of its stderr>}``.
    """
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO / "src"), env.get("PYTHONPATH")) if p)
    proc = subprocess.run(
        [sys.executable, str(Path(script).resolve()), "--export-child", variant, "--out", str(out)],
        capture_output=True, text=True, env=env, timeout=timeout,
    )
    if proc.returncode != 0:
        if keep_going:
            return {"variant": variant,
                    "error": proc.stderr.strip().splitlines()[-1][:300] if proc.stderr else "failed"}
        raise RuntimeError(f"{what} of {variant} failed (rc={proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def export_summary(record: dict, size_key: str = "bytes", size_name: str = "") -> str:
    """The progress line after one export: times, peak RSS, size against the weights."""
    return (f"export {record['export_s']:.1f} s, save {record['save_s']:.1f} s, peak RSS "
            f"{record['peak_rss'] / 1e6:.0f} MB, {size_name}{record[size_key] / 1e6:.0f} MB for "
            f"{record['weight_bytes'] / 1e6:.0f} MB of weights")


# --- generation timing -----------------------------------------------------------------------------------------------


def timed_generate(generate: Any, inputs: dict, new_tokens: int, **kwargs: Any) -> tuple[list[int], dict]:
    """Greedy ``generate(**inputs, **kwargs)`` timed by the ``TimingStreamer`` of ``hfexport run``; the new tokens and
    the stats (``prefill_s``, ``decode_s``, ``decode_steps``, ``decode_tok_s``)."""
    import torch

    from hfexport.generation.streamers import TimingStreamer

    streamer = TimingStreamer()
    with torch.no_grad():
        out = generate(**inputs, max_new_tokens=new_tokens, do_sample=False, streamer=streamer, **kwargs)
    stats = streamer.stats()
    stats["decode_tok_s"] = stats.pop("decode_tokens_per_s") or float("nan")
    return out[0, inputs["input_ids"].shape[-1]:].tolist(), stats


def loop_stats(start: float, first: float, end: float, tokens: list[int]) -> dict:
    """The stats of ``timed_generate`` for a hand-written loop: started, first token, last token (perf_counter)."""
    steps = len(tokens) - 1
    return {"prefill_s": first - start, "decode_s": end - first, "decode_steps": steps,
            "decode_tok_s": steps / (end - first) if steps else float("nan")}


def warm_up(runners: dict[str, Runner], tag: str, errors: dict | None = None) -> None:
    """Four tokens from each runner. With ``errors``, a runner that fails is dropped and its error recorded there
    under ``load:<name>``; without, the failure propagates."""
    print(f"[{tag}] warm-up (4 tokens each) ...", flush=True)
    for name, fn in list(runners.items()):
        try:
            fn(4)
        except Exception as error:  # noqa: BLE001 - reported in the results, not fatal
            if errors is None:
                raise
            errors[f"load:{name}"] = {"error": f"{type(error).__name__}: {str(error)[:300]}"}
            del runners[name]


def interleaved_rounds(runners: dict[str, Runner], repeats: int, new_tokens: int, tag: str) -> dict[str, dict]:
    """Each runner once per round, in order (eager first), ``repeats`` rounds: ``{name: {"rounds": [stats],
    "round_tokens": [tokens]}}``."""
    results: dict[str, dict] = {name: {"rounds": [], "round_tokens": []} for name in runners}
    for r in range(repeats):
        for name, fn in runners.items():
            tokens, stats = fn(new_tokens)
            results[name]["rounds"].append(stats)
            results[name]["round_tokens"].append(tokens)
            print(f"[{tag}] round {r + 1}/{repeats} {name:16s} {len(tokens)} tokens, prefill "
                  f"{stats['prefill_s'] * 1e3:.0f} ms, decode {stats['decode_tok_s']:.1f} tok/s", flush=True)
    return results


def summarise(results: dict[str, dict], reference: str = "eager") -> list[int]:
    """Best decode tok/s and prefill per runner, and whether every round's tokens start with the reference's first
    round (a loop with no end-of-sequence stop may run on after eager stopped); returns the reference tokens."""
    tokens = results[reference]["round_tokens"][0]
    for res in results.values():
        res["decode_tok_s"] = max(s["decode_tok_s"] for s in res["rounds"])
        res["prefill_s"] = min(s["prefill_s"] for s in res["rounds"])
        res["same_tokens"] = all(t[: len(tokens)] == tokens for t in res["round_tokens"])
        res["first_difference"] = next((i for i, (a, b) in enumerate(zip(res["round_tokens"][0], tokens))
                                        if a != b), None)
        res["tokens"] = len(res["round_tokens"][0])
        del res["round_tokens"]
    return tokens


class TimedMethod:
    """Stands in for ``target``: calls of its method ``name`` are timed into ``times`` (seconds); every other
    attribute is the target's. The timed method is an attribute of the instance, so a call costs what it did."""

    def __init__(self, target: Any, name: str):
        self.target, self.times = target, []
        method = getattr(target, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            out = method(*args, **kwargs)
            self.times.append(time.perf_counter() - start)
            return out

        setattr(self, name, timed)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.target, name)


def overhead_row(step_ms: float, inside_ms: float) -> dict:
    """A per-step overhead row: a decode step's wall time, the time inside the runtime's call, the rest."""
    return {"step_ms": step_ms, "ort_ms": inside_ms, "overhead_ms": step_ms - inside_ms}


# --- the run and its report ------------------------------------------------------------------------------------------


def timed_run(prefix: str, repeats: int, body: Callable[[Path, dict], None]) -> dict:
    """``body(workdir, report)`` in a fresh temporary folder (removed after); the report gets the load average at
    start and end and the wall time."""
    workdir = Path(tempfile.mkdtemp(prefix=prefix))
    report: dict[str, Any] = {"repeats": repeats, "load_start": os.getloadavg()}
    start = time.perf_counter()
    try:
        body(workdir, report)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    report["load_end"] = os.getloadavg()
    report["wall_s"] = time.perf_counter() - start
    return report


def loads(report: dict) -> str:
    """``"a/b/c / d/e/f"``: the load averages at start and end."""
    return f"{'/'.join(f'{x:.1f}' for x in report['load_start'])} / {'/'.join(f'{x:.1f}' for x in report['load_end'])}"


def table_head(*columns: str) -> list[str]:
    return ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]


def export_cells(record: dict | None, size_key: str = "bytes", load: dict | None = None) -> str:
    """``export s | peak RSS MB | size MB (x weights)`` and, where ``load`` is given, ``| load s``; dashes for a
    runner without an export (eager) or whose export failed."""
    if not record or "error" in record:
        return " | ".join(["–"] * (3 if load is None else 4))
    size = record[size_key]
    cells = (f"{record['export_s']:.1f} | {record['peak_rss'] / 1e6:.0f} | {size / 1e6:.0f} "
             f"({size / record['weight_bytes']:.2f}x)")
    if load is None:
        return cells
    return f"{cells} | {load['load_s']:.1f}" if "load_s" in load else f"{cells} | –"


def result_cells(res: dict, eager_tok_s: float, where: bool = False) -> str:
    """``prefill ms | decode tok/s | vs eager | same tokens``; ``where``: say at which token a mismatch starts."""
    same = "yes" if res["same_tokens"] else "**NO**" + (
        f" (first difference at token {res['first_difference']})" if where else "")
    return (f"{res['prefill_s'] * 1e3:.0f} | {res['decode_tok_s']:.1f} | {res['decode_tok_s'] / eager_tok_s:.2f}x | "
            f"{same}")


def files_line(exports: dict[str, dict]) -> str:
    """``Weights: N MB. Files: variant: name MB, ...; ...`` over the exports that recorded their files."""
    weights = next(e["weight_bytes"] for e in exports.values() if "weight_bytes" in e)
    return f"Weights: {weights / 1e6:.0f} MB. Files: " + "; ".join(
        f"{v}: " + ", ".join(f"{n} {b / 1e6:.1f} MB" for n, b in sorted(e["files"].items()) if b > 1e5)
        for v, e in exports.items() if "files" in e) + "."


def base_parser(doc: str, results: Path, quick_help: str) -> argparse.ArgumentParser:
    """The options every benchmark takes (benchmarks/run.py passes each one all of them: parse_known_args)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help=quick_help)
    parser.add_argument("--results", type=Path, default=results)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    return parser


def write_results(path: Path, text: str, report: dict, tag: str) -> None:
    """The Markdown section to ``path`` and the whole report next to it as JSON."""
    path.write_text(text)
    path.with_suffix(".json").write_text(json.dumps(report, indent=2, default=str))
    print(f"[{tag}] wrote {path}")


def run_main(args: argparse.Namespace, tag: str, key: str, export_child: Callable[[str, Path], dict],
             run: Callable[[dict], str]) -> dict | None:
    """The body of a benchmark's ``main``: as the export child (``--export-child``), print the export's record and
    return None; else ``run(results)``, print its Markdown section and, unless ``--quick``, write it to
    ``args.results`` and the report ``results[key]`` next to it as JSON; return that report."""
    ensure_importable()
    if args.export_child:
        print(json.dumps(export_child(args.export_child, args.out)))
        return None
    results: dict = {}
    text = run(results)
    print("\n" + text)
    if not args.quick:
        write_results(args.results, text, results[key], tag)
    return results[key]


def token_mismatch(names: list[str], tag: str) -> int:
    """Exit status 1, said on stderr, when any of ``names`` (runs whose tokens differ from eager's) exists."""
    if names:
        print(f"[{tag}] TOKEN MISMATCH vs eager: {', '.join(names)}", file=sys.stderr)
        return 1
    return 0


# --- roofline --------------------------------------------------------------------------------------------------------


def copy_gbps(nbytes: int, seconds: float) -> float:
    """GB/s of a copy of ``nbytes`` in ``seconds``: a copy reads and writes each byte, 2 * nbytes moved (STREAM's
    "copy" convention)."""
    return 2 * nbytes / seconds / 1e9


def memory_bandwidth(nbytes: int = 1 << 30, repeats: int = 5, threads: int | None = None) -> float:
    """This machine's memory bandwidth in GB/s: the best of ``repeats`` copies of an ``nbytes`` numpy array into
    another (both touched first, so no page fault is timed), split over ``threads`` threads (default: one per core,
    as the runtimes decode with; numpy releases the GIL while it copies). One thread alone does not saturate the
    memory controller: on the 2-core machine here, a quiet single-thread copy gave 41 GB/s where 2 threads reading
    gave 46. Needs 2 * ``nbytes`` of free memory."""
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    workers = max(1, threads or os.cpu_count() or 1)
    src = np.ones(nbytes, dtype=np.uint8)
    dst = np.zeros_like(src)
    bounds = np.linspace(0, nbytes, workers + 1, dtype=np.int64)
    pieces = [(dst[a:b], src[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
    best = float("inf")
    with ThreadPoolExecutor(workers) as pool:
        for _ in range(repeats):
            start = time.perf_counter()
            list(pool.map(lambda pair: np.copyto(*pair), pieces))
            best = min(best, time.perf_counter() - start)
    return copy_gbps(nbytes, best)


def decode_bound(weight_bytes: int, gbps: float) -> float:
    """Tokens/s ceiling of batch-1 decoding when each token reads every weight once at ``gbps`` GB/s (the cache and
    activations not counted: an upper bound)."""
    return gbps * 1e9 / weight_bytes
