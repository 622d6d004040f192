"""PyTorch's flight recorder (TORCH_FR_BUFFER_SIZE: the last collectives of every process
group, NCCL and gloo alike, DDP's own included), dumped on the stall watch's request.

A stalled rank's main thread is stuck, so the dump runs on a daemon thread that sleeps in a
blocking read of a FIFO (`rank-N.fr-request`) until launch writes to it; it then writes
`rank-N.fr.json` (torch's JSON dump). A wait in a gloo or NCCL collective releases the GIL, so
the thread runs; a rank whose thread holds the GIL gives no dump (its stacks still come).
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from pathlib import Path

ENV_BUFFER = "TORCH_FR_BUFFER_SIZE"


def request_path(directory: str | Path, rank: int) -> Path:
    return Path(directory) / f"rank-{rank}.fr-request"


def dump_path(directory: str | Path, rank: int) -> Path:
    return Path(directory) / f"rank-{rank}.fr.json"


def start_responder(directory: str, rank: int) -> None:
    """Make the FIFO and the thread that answers it (nothing without a recorder)."""
    if not os.environ.get(ENV_BUFFER):
        return
    fifo = request_path(directory, rank)
    with contextlib.suppress(FileNotFoundError):
        fifo.unlink()
    try:
        os.mkfifo(fifo, 0o600)
    except OSError:
        return
    thread = threading.Thread(
        target=_answer, args=(fifo, dump_path(directory, rank)), name="kubeddp-fr", daemon=True
    )
    thread.start()


def _answer(fifo: Path, out: Path) -> None:
    while True:
        try:
            with open(fifo, "rb") as f:  # blocks until launch opens it for writing
                f.read()
        except OSError:
            return
        try:
            import torch._C._distributed_c10d as c10d

            text = c10d._dump_fr_trace_json()
            if isinstance(text, bytes):
                text = text.decode(errors="replace")
        except Exception as exc:  # no process group yet, or a torch without the recorder
            text = json.dumps({"error": f"{type(exc).__name__}: {exc}"})
        tmp = out.with_suffix(".tmp")
        with contextlib.suppress(OSError):
            tmp.write_text(text)
            os.replace(tmp, out)


def request(directory: str | Path, rank: int) -> bool:
    """Ask rank `rank` for a dump (launch side); False when nobody listens."""
    try:
        fd = os.open(request_path(directory, rank), os.O_WRONLY | os.O_NONBLOCK)
    except OSError:  # ENXIO: no reader; ENOENT: no recorder in that rank
        return False
    try:
        os.write(fd, b"1")
    except OSError:
        return False
    finally:
        os.close(fd)
    return True


def summary(text: str) -> str:
    """One line per process group: its last collective, its sequence number, and whether it
    finished (`retired`), from a dump's JSON."""
    try:
        dump = json.loads(text)
    except ValueError:
        return "flight recorder: unreadable dump"
    if "error" in dump:
        return f"flight recorder: {dump['error']}"
    last: dict[str, dict] = {}
    for entry in dump.get("entries") or []:
        group = entry.get("process_group") or ["?", "?"]
        name = group[1] if group[1] not in ("", "undefined") else "group"
        last[f"{name} ({group[0]})"] = entry
    if not last:
        return "flight recorder: no collective recorded"
    parts = []
    for group, entry in last.items():
        done = "finished" if entry.get("retired") else "not finished"
        name = str(entry.get("profiling_name", "?")).split(":")[-1]
        parts.append(f"{group}: {name} #{entry.get('collective_seq_id')} ({done})")
    return "flight recorder: " + "; ".join(parts)
