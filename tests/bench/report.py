"""bench-results/report.md (a Markdown table) and report.json from the collected rows."""

from __future__ import annotations

import json
import math
import os
import platform
from pathlib import Path

import torch

from tests.bench.common import Row


def machine() -> dict[str, str]:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": str(os.cpu_count()),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none",
    }


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def disagreement(row: Row) -> str:
    """Why a row's ratio is not the quotient of the two values its absolute column shows
    (rows made by common.paired carry them as extra["pair"]); "" when it is, or has none."""
    pair = row.extra.get("pair")
    if row.ratio is None or not pair:
        return ""
    a, b = pair
    if b and math.isclose(row.ratio, a / b, rel_tol=1e-9):
        return ""
    return f"ratio {row.ratio:.3f} is not {a:g} / {b:g}"


def render_markdown(rows: list[Row], info: dict[str, str], mode: str, seconds: float) -> str:
    lines = [
        "# kubeddp benchmark report",
        "",
        f"Machine: {info['cpu']}, {info['cores']} cores, GPU: {info['cuda']}; "
        f"Python {info['python']}, torch {info['torch']}. Mode: {mode}; took {seconds:.0f} s.",
        "",
        "Every ratio is against a baseline measured in the same run (median of repeats).",
        "",
        "| section | benchmark | ratio | against | absolute | goal | notes |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        ratio = "not measured" if row.ratio is None else f"{row.ratio:.3f}"
        wrong = disagreement(row)
        if wrong:  # a bench bug: said in the table rather than printed as if it were true
            ratio = f"{ratio} (DISAGREES: {wrong})"
        goal = f"{row.goal} ({row.status})" if row.goal and row.ratio is not None else row.goal
        cells = [row.section, row.name, ratio, row.against, row.absolute, goal, row.note]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


def write_report(out: Path, rows: list[Row], mode: str, seconds: float) -> tuple[Path, Path]:
    out.mkdir(parents=True, exist_ok=True)
    info = machine()
    md = out / "report.md"
    md.write_text(render_markdown(rows, info, mode, seconds))
    js = out / "report.json"
    payload = {"machine": info, "mode": mode, "seconds": seconds}
    payload["rows"] = [r.to_dict() for r in rows]
    js.write_text(json.dumps(payload, indent=2) + "\n")
    return md, js
