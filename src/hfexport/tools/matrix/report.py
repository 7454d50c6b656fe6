"""The matrix's reports: CSV (one row per case), Markdown (coverage per backend, a grid, the failure reasons) and a
PNG heat map (matplotlib, imported only here and only when the PNG is asked for).

Coverage of a backend and stage = passing cases / cases whose tiny model could be built (``cannot-build`` rows are
left out of the denominator, every other status counts against coverage).
"""

from __future__ import annotations

import csv
import re
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .discovery import GENERATIVE_TASKS

__all__ = ["FIELDS", "STATUSES", "coverage", "write_csv", "write_markdown", "write_heatmap",
           "write_reports"]

FIELDS = ("model_type", "class_name", "task", "backend", "stage", "status", "max_abs_diff", "mismatched_tokens",
          "export_seconds", "wall_seconds", "reason")
STATUSES = ("pass", "mismatch", "fail", "timeout", "eager-fails", "no-inputs", "cannot-build", "unavailable")
_COLOURS = {"pass": "#2e7d32", "mismatch": "#f9a825", "fail": "#c62828", "timeout": "#6a1b9a",
            "eager-fails": "#8d6e63", "no-inputs": "#bcaaa4", "cannot-build": "#9e9e9e", "unavailable": "#e0e0e0",
            "not run": "#cfe3f3",
            "n/a": "#ffffff"}


_ORDER = ("dynamo", "onnx", "executorch", "openvino", "aoti")


def _columns(rows: list[dict[str, Any]]) -> list[tuple[str, str]]:
    seen = list(dict.fromkeys(r["backend"] for r in rows))
    backends = [b for b in _ORDER if b in seen] + [b for b in seen if b not in _ORDER]
    stages = [s for s in ("export", "generate") if any(r["stage"] == s for r in rows)]
    return [(b, s) for b in backends for s in stages]


def coverage(rows: Iterable[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    """``(backend, stage) -> {"pass", "total", "counted", "percent", "eager_percent", "counts"}``; ``counted``
    leaves out ``cannot-build``, ``percent`` is ``None`` when nothing is counted or the backend is unavailable;
    ``eager_percent`` also leaves ``eager-fails`` and ``no-inputs`` out (cases the matrix's inputs exercise)."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    rows = list(rows)
    for key in _columns(rows):
        mine = [r for r in rows if (r["backend"], r["stage"]) == key]
        counts = Counter(r["status"] for r in mine)
        counted = len(mine) - counts["cannot-build"]
        unavailable = counts["unavailable"] == counted and counted > 0
        percent = None if not counted or unavailable else round(100.0 * counts["pass"] / counted, 1)
        eager = counted - counts["eager-fails"] - counts["no-inputs"]
        eager_percent = None if not eager or unavailable else round(100.0 * counts["pass"] / eager, 1)
        out[key] = {"pass": counts["pass"], "total": len(mine), "counted": counted, "percent": percent,
                    "eager_percent": eager_percent, "counts": dict(counts)}
    return out


def write_csv(rows: list[dict[str, Any]], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS, extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: ("" if row.get(k) is None else row.get(k)) for k in FIELDS})
    return path


def _cell(row: dict[str, Any] | None, applies: bool = False) -> str:
    if row is None:  # "not run": the stage applies but this backend has no row for it (a partial run)
        return "not run" if applies else "—"
    status = row["status"]
    if status == "pass" and row.get("max_abs_diff") is not None:
        return f"pass {row['max_abs_diff']:.0e}, {row['export_seconds']:.0f} s"
    if status == "pass" and row.get("export_seconds") is not None:
        return f"pass, {row['export_seconds']:.0f} s"
    return status


def _kind(reason: str) -> str:
    """A reason without its numbers, source location and model names: rows failing the same way group together."""
    text = re.sub(r" \((?:models|integrations|capture|backends)/[^)]*\)", "", reason.split(" | cause: ")[0])
    text = re.sub(r"\b[A-Z]\w*(?:For\w+|Model|Config)\b", "<Model>", text)
    return re.sub(r"\d+", "N", text).replace("`", "'")[:110].strip()


def _summary(rows: list[dict[str, Any]], top: int = 8) -> list[str]:
    """The most frequent kinds of reason per non-passing status, with counts."""
    lines: list[str] = []
    for status in STATUSES:
        if status in ("pass", "unavailable"):
            continue
        kinds = Counter(_kind(str(r.get("reason") or "")) for r in rows if r["status"] == status)
        if not kinds:
            continue
        shown = "; ".join(f"{n} x `{k}`" for k, n in kinds.most_common(top))
        rest = sum(kinds.values()) - sum(n for _, n in kinds.most_common(top))
        lines.append(f"- **{status}** ({sum(kinds.values())} cases): {shown}" + (f"; {rest} other" if rest else ""))
    return lines


def write_markdown(rows: list[dict[str, Any]], path: Path, header: str = "") -> Path:
    """Coverage per backend and stage, a grid (one line per architecture) and every non-passing reason."""
    cols = _columns(rows)
    cov = coverage(rows)
    archs = sorted(dict.fromkeys((r["model_type"], r["class_name"], r["task"]) for r in rows))
    index = {(r["model_type"], r["backend"], r["stage"]): r for r in rows}
    lines = ["# Support matrix", ""]
    if header:
        lines += [header.rstrip(), ""]
    lines += ["## Coverage", "",
              "Coverage = passing cases / cases whose tiny model could be built: `cannot-build` rows are left out "
              "of the denominator; every other status (mismatch, fail, timeout, eager-fails, no-inputs) counts "
              "against it.", "",
              "Where inputs work = the same, with `eager-fails` (the matrix's inputs fail in eager PyTorch too) and "
              "`no-inputs` rows (the matrix has no inputs that exercise the model) also left out: what the backend "
              "does with what the matrix can test.", "",
              "| backend | stage | pass | counted | cannot-build | coverage | eager-fails + no-inputs | "
              "where inputs work |",
              "|---|---|---|---|---|---|---|---|"]
    for (backend, stage), c in cov.items():
        pct = "n/a (backend not available in this release)" if c["percent"] is None else f"{c['percent']:.1f} %"
        eager = "n/a" if c["eager_percent"] is None else f"{c['eager_percent']:.1f} %"
        lines.append(f"| {backend} | {stage} | {c['pass']} | {c['counted']} | "
                     f"{c['counts'].get('cannot-build', 0)} | {pct} | "
                     f"{c['counts'].get('eager-fails', 0) + c['counts'].get('no-inputs', 0)} | {eager} |")
    status_counts = Counter(r["status"] for r in rows)
    lines += ["", "Statuses over all cases: " + ", ".join(f"{s} {status_counts[s]}" for s in STATUSES
                                                         if status_counts[s]) + ".", "",
              "`pass` = every output leaf within the fp32 bound (1e-4 Dynamo/ONNX, 1e-3 ExecuTorch/OpenVINO) for "
              "`export`, greedy tokens equal to eager `model.generate` for `generate`; `eager-fails` = the matrix's "
              "sample inputs do not run even in eager PyTorch (a gap of the matrix, not of the backend). "
              "Image-text-to-text models get one image per row and its placeholder tokens (wrapped in the family's "
              "start and end tokens, with the processor's `mm_token_type_ids`) where their `get_image_features` "
              "takes pixels (with sizes, a mask, a second tower's pixels), patches and a grid (Qwen-VL-like) or "
              "NaFlex patches, and an image-token id is all they need (Qwen2-VL and LLaVA use the hand-written tiny "
              "inputs of `hfexport.testing.tiny`); the others get text only, and where the generation capture then "
              "sees the "
              "vision or audio tower never called the row is `no-inputs` (as when the matrix has no recipe for a "
              "model's main input): a gap of the matrix, not of the backend. `cannot-build` = the matrix cannot "
              "shrink or build the tiny model (missing package such as timm, a size field its rules miss, a "
              "config validator they break).", "",
              "Main reasons per status (numbers as N, model classes as <Model>; every row's own reason is in "
              "§ Reasons):", "", *_summary(rows), "", "![heat map](support-matrix.png)", "",
              "## Grid", "",
              "Cells: status, max abs diff vs eager (export), export seconds; `—`: the stage does not apply "
              "(not generative); `not run`: no run of this backend covered the architecture.", "",
              "| model_type | class | task | " + " | ".join(f"{b} {s}" for b, s in cols) + " |",
              "|---|---|---|" + "---|" * len(cols)]
    for model_type, class_name, task in archs:
        cells = [_cell(index.get((model_type, b, s)), s == "export" or task in GENERATIVE_TASKS) for b, s in cols]
        lines.append(f"| {model_type} | {class_name} | {task} | " + " | ".join(cells) + " |")
    bad = sorted((r for r in rows if r["status"] not in ("pass", "unavailable")),
                 key=lambda r: (r["model_type"], r["backend"], r["stage"]))
    if bad:
        lines += ["", "## Reasons", "", "| model_type | backend | stage | status | reason |", "|---|---|---|---|---|"]
        for r in bad:
            reason = str(r.get("reason") or "").replace("|", "\\|").replace("\n", " ")
            lines.append(f"| {r['model_type']} | {r['backend']} | {r['stage']} | {r['status']} | {reason} |")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


def write_heatmap(rows: list[dict[str, Any]], path: Path, title: str = "hfexport support matrix",
                  per_panel: int = 160) -> Path:
    """One row per architecture (sorted, in panels of ``per_panel`` side by side), one column per backend and stage,
    coloured by status (white: not applicable; light blue: not run)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    cols = _columns(rows)
    archs = sorted({r["model_type"] for r in rows})
    generative = {r["model_type"] for r in rows if r.get("task") in GENERATIVE_TASKS}
    names = list(_COLOURS)
    index = {(r["model_type"], r["backend"], r["stage"]): r["status"] for r in rows}

    def status(a: str, b: str, s: str) -> str:
        return index.get((a, b, s), "not run" if s == "export" or a in generative else "n/a")

    cov = coverage(rows)
    labels = [f"{b}\n{s}\n{'n/a' if cov[(b, s)]['percent'] is None else str(cov[(b, s)]['percent']) + ' %'}"
              for b, s in cols]
    panels = [archs[i:i + per_panel] for i in range(0, len(archs), per_panel)] or [[]]
    tallest = max(len(p) for p in panels)
    height = max(3.0, 0.13 * tallest + 1.8)
    fig, axes = plt.subplots(1, len(panels), squeeze=False,
                             figsize=((1.6 + 0.55 * len(cols)) * len(panels) + 1.6, height))
    cmap = ListedColormap([_COLOURS[n] for n in names])
    for ax, panel in zip(axes[0], panels):
        grid = [[names.index(status(a, b, s)) for b, s in cols] for a in panel]
        grid += [[names.index("n/a")] * len(cols)] * (tallest - len(panel))  # equal heights, blank tail
        ax.imshow(grid, cmap=cmap, vmin=0, vmax=len(names) - 1, aspect="auto", interpolation="nearest")
        ax.set_xticks(range(len(cols)), labels, fontsize=6)
        ax.xaxis.tick_top()
        ax.set_yticks(range(len(panel)), panel, fontsize=5)
    fig.suptitle(f"{title}: {len(archs)} architectures (coverage = pass / buildable cases run)", fontsize=9)
    used = sorted({status(a, b, s) for a in archs for b, s in cols}, key=names.index)
    axes[0][-1].legend(handles=[Patch(facecolor=_COLOURS[n], edgecolor="black", label=n) for n in used],
                       loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=7, frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.4 / height))  # the title above the column labels
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def write_reports(rows: list[dict[str, Any]], out_dir: Path, header: str = "", png: bool = True) -> list[Path]:
    """``support-matrix.csv``, ``.md`` and (with ``png``) ``.png`` in ``out_dir``."""
    out_dir = Path(out_dir)
    paths = [write_csv(rows, out_dir / "support-matrix.csv"), write_markdown(rows, out_dir / "support-matrix.md",
                                                                              header)]
    if png:
        paths.append(write_heatmap(rows, out_dir / "support-matrix.png"))
    return paths
