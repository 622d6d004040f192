"""PyTorch's flight recorder (its buffer size under the name the installed torch reads:
process_contract.fr_buffer_names; the last collectives of every process group, NCCL and gloo
alike, DDP's own included), dumped on the stall watch's request.

A stalled rank's main thread is stuck, so the dump runs on a daemon thread that sleeps in a
blocking read of a FIFO (`rank-N.fr-request`) until launch writes to it; it then writes
`rank-N.fr.json` (torch's JSON dump). A wait in a gloo or NCCL collective releases the GIL, so
the thread runs; a rank whose thread holds the GIL gives no dump (its stacks still come). The
file names and launch's request are the process contract's (trainer/process_contract.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from pathlib import Path

from kubeddp.trainer.common import installed_torch_version
from kubeddp.trainer.process_contract import fr_buffer_size, fr_dump_path, fr_request_path


def start_responder(directory: str, rank: int) -> None:
    """Make the FIFO and the thread that answers it (nothing without a recorder)."""
    if fr_buffer_size(os.environ, installed_torch_version()) == 0:
        return
    fifo = fr_request_path(directory, rank)
    with contextlib.suppress(FileNotFoundError):
        fifo.unlink()
    try:
        os.mkfifo(fifo, 0o600)
    except OSError:
        return
    thread = threading.Thread(
        target=_answer, args=(fifo, fr_dump_path(directory, rank)), name="kubeddp-fr", daemon=True
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
