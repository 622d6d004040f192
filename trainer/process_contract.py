"""What crosses the process boundary between `kubeddp launch` and the workers it starts.

Launch (trainer/launcher/) and the workers (trainer/worker/: the built-in trainer and the runner
of a user's program) import this module for every piece they share, and nothing of each
other's for it (tests/lint/test_process_contract.py):

- the environment launch sets for its workers (the names below), the config among it: the
  config launch loaded and checked, as JSON (`resolved_config_env` / `resolved_config`), the
  one way it reaches a worker;
- each rank's heartbeat record (the layout below and its reader; the rank's writer is
  worker/heartbeat.py, which packs these fields in place), read by the stall watch and /metrics;
- the stall watch's handshake with a stalled rank: STACKS_SIGNAL makes the rank's faulthandler
  append its stacks to `rank-N.stacks`; one byte into the FIFO `rank-N.fr-request` makes it
  write its flight recorder to `rank-N.fr.json` (worker/flight_recorder.py answers);
- the early-exit marker a worker of a user's program leaves when it returns 0;
- rank 0's progress record for a TrainJob's status (worker/status_feed.py writes it,
  launcher/trainjob_status.py posts it to Kubeflow Trainer);
- rank 0's network check results (worker/network.py writes them, launcher/network_metrics.py
  serves them on /metrics);
- each worker's metrics (worker/metrics.py writes them, launcher/worker_metrics.py serves the
  merge of every worker's, live or dead, on /metrics).

Files live in the directories launch names in the environment; every name here is part of the
contract, so changing one changes both sides at once.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import secrets
import signal
import struct
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kubeddp.trainer.config import Config

# ---- The environment launch gives its workers --------------------------------------------
# The config launch loaded, as JSON, so no worker reads the file or the overrides again (and
# none can see a different file than launch checked).
ENV_RESOLVED_CONFIG = "KUBEDDP_RESOLVED_CONFIG"
ENV_LAUNCHER_PID = "KUBEDDP_LAUNCHER_PID"  # the pid workers die with (worker/parent_death.py)
ENV_RDZV_SOURCE = "KUBEDDP_RDZV_SOURCE"  # where the rendezvous came from; shown in kubeddp_info
ENV_SPAWNS_WORKERS = "KUBEDDP_SPAWNS_WORKERS"  # "1": the program spawns its own workers
ENV_EXITED_DIR = "KUBEDDP_EXITED_DIR"  # where a worker of a program notes that it returned 0
ENV_DIAG_DIR = "KUBEDDP_DIAG_DIR"  # the ranks' heartbeat records (no diagnostics: unset)
# prometheus_client's own variable: where the workers write their metric files (kubeddp's own,
# below, and a user's program's prometheus_client files), which launch serves merged
ENV_PROMETHEUS_MULTIPROC_DIR = "PROMETHEUS_MULTIPROC_DIR"
ENV_STATUS_FILE = "KUBEDDP_STATUS_FILE"  # rank 0's progress record (TrainJob status)
# Rank 0's network check results, JSON, in the ENV_PROMETHEUS_MULTIPROC_DIR directory
NETWORK_CHECK_FILE = "network-check.json"
# torch's flight recorder: how many events it keeps (0: off). torch before 2.8 reads only
# TORCH_NCCL_TRACE_BUFFER_SIZE; 2.8 and later read TORCH_FR_BUFFER_SIZE and, when that is unset,
# the old name (c10d's FlightRecorder.hpp: getCvarInt takes the first name that is set). The
# stall watch turns it on for the workers, under the name their torch reads, unless the user
# set either name (0 included): the user's setting wins.
ENV_FR_BUFFER = "TORCH_FR_BUFFER_SIZE"
ENV_FR_BUFFER_BEFORE_2_8 = "TORCH_NCCL_TRACE_BUFFER_SIZE"
FR_BUFFER_NEW_NAME_SINCE = (2, 8)
FR_BUFFER_DEFAULT = "2000"
# Set by launch for its workers: Python's PYTHONSAFEPATH, which keeps the working directory
# (checkpoint.dir in a pod) off sys.path; the runner removes it again for the user's program.
ENV_SAFE_PATH = "PYTHONSAFEPATH"
ENV_SAFE_PATH_ADDED = "KUBEDDP_SAFE_PATH_ADDED"
# Set by launch when it moves a program into checkpoint.dir: where it started (`--module`
# programs are found there, as `python -m` finds them in the working directory)
ENV_LAUNCH_DIR = "KUBEDDP_LAUNCH_DIR"


def _release(version: str | None) -> tuple[int, ...] | None:
    found = re.match(r"\s*v?(\d+(?:\.\d+)*)", version or "")
    return tuple(int(part) for part in found.group(1).split(".")) if found else None


def fr_buffer_names(torch_version: str | None) -> tuple[str, ...]:
    """The names this torch reads the flight recorder's size from, the winning one first (a
    version that cannot be read: today's torch)."""
    release = _release(torch_version)
    if release is not None and release[:2] < FR_BUFFER_NEW_NAME_SINCE:
        return (ENV_FR_BUFFER_BEFORE_2_8,)
    return (ENV_FR_BUFFER, ENV_FR_BUFFER_BEFORE_2_8)


def fr_buffer_default(env: Mapping[str, str], torch_version: str | None) -> dict[str, str]:
    """kubeddp's recorder size under the name this torch reads; nothing when the user set
    either of torch's names (even to 0, to turn the recorder off)."""
    if ENV_FR_BUFFER in env or ENV_FR_BUFFER_BEFORE_2_8 in env:
        return {}
    return {fr_buffer_names(torch_version)[0]: FR_BUFFER_DEFAULT}


def fr_buffer_size(env: Mapping[str, str], torch_version: str | None) -> int:
    """The recorder's size as this torch reads it from `env` (0: off; unset or unreadable
    counts as 0: the responder is started only where kubeddp or the user turned it on)."""
    for name in fr_buffer_names(torch_version):
        if name in env:
            try:
                return max(int(env[name].strip()), 0)
            except ValueError:
                return 0
    return 0


def resolved_config_env(cfg: Config) -> dict[str, str]:
    """The environment that hands `cfg` to the workers (see resolved_config)."""
    return {ENV_RESOLVED_CONFIG: json.dumps(cfg.to_dict())}


def resolved_config(env: Mapping[str, str]) -> Config | None:
    """The config `kubeddp launch` resolved for this worker; None when launch did not start it."""
    # Imported here: the record readers below serve processes that never load a config.
    from kubeddp.trainer.config import ConfigError, config_from_dict

    raw = env.get(ENV_RESOLVED_CONFIG)
    if not raw:
        return None
    try:
        data = json.loads(raw)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        raise ConfigError(
            f"${ENV_RESOLVED_CONFIG} is not a JSON config mapping; unset it (kubeddp launch "
            "sets it for its workers) and pass --config/--set instead"
        )
    return config_from_dict(data)


# ---- The heartbeat record: one small mmap'd file per rank in $KUBEDDP_DIAG_DIR -----------
# Times are time.monotonic() (one clock for every process on the machine).
RECORD_GLOB = "rank-*.hb"
STACKS_SIGNAL = signal.SIGUSR1  # the rank's faulthandler appends every thread's stack
MAGIC = b"KDHB"
VERSION = 1

# Phases, by their code in the record (the order is the file format: append only).
PHASES = (
    "starting",  # before the first step: nothing is watched yet
    "data",
    "forward/backward",
    "optimizer",
    "checkpoint",
    "eval",
    "collective",
    "step",  # a user program between two report_step calls
    "finished",
)
PHASE_CODE = {name: code for code, name in enumerate(PHASES)}
# Collectives kubeddp counts (the op code is the index; append only).
COLLECTIVES = (
    "all_reduce",
    "broadcast",
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter_tensor",
    "all_to_all_single",
    "reduce",
    "gather",
    "scatter",
    "barrier",
    "all_gather_object",
    "broadcast_object_list",
    "all_gather_single",
    "reduce_scatter_single",
)
NONFINITE_WHAT = ("loss", "gradient norm")

# Fields and their offsets (the record is RECORD_SIZE bytes; readers check MAGIC and VERSION).
HEADER_FIELDS = struct.Struct("<4sIqQ")  # magic, version, pid, main thread id
STEP_FIELDS = struct.Struct("<qd")  # step, when it ended
PHASE_FIELDS = struct.Struct("<i4xd")  # phase, since
COLLECTIVE_FIELDS = struct.Struct("<qqi4xd")  # started, done, op, since
NONFINITE_FIELDS = struct.Struct("<qi4x")  # first non-finite step (-1: none), what
BUSY_FIELDS = struct.Struct("<d")  # seconds this rank worked in its steps (not waiting)
STRAGGLER_FIELDS = struct.Struct("<d")  # 0, or its busy time over the median (the verdict)
OP_COUNT_FIELDS = struct.Struct("<q")  # one per op in COLLECTIVES: how many it started
STEP_AT, PHASE_AT, COLLECTIVE_AT, NONFINITE_AT = 24, 40, 56, 88
BUSY_AT, STRAGGLER_AT, OP_COUNTS_AT = 104, 112, 120
RECORD_SIZE = OP_COUNTS_AT + 8 * 16  # room for 16 ops


def record_path(directory: str | Path, rank: int) -> Path:
    return Path(directory) / f"rank-{rank}.hb"


def stacks_path(directory: str | Path, rank: int) -> Path:
    return Path(directory) / f"rank-{rank}.stacks"


@dataclass(frozen=True)
class RankRecord:
    """One rank's record as read by another process."""

    rank: int
    pid: int
    main_thread: int
    step: int
    step_at: float
    phase: str
    phase_since: float
    collectives_started: int
    collectives_done: int
    collective_op: str
    collective_since: float
    nonfinite_step: int
    nonfinite_what: str
    busy_seconds: float
    straggler_ratio: float
    op_counts: tuple[int, ...]  # per op of COLLECTIVES

    @property
    def last_progress(self) -> float:
        """The latest sign of life the rank itself wrote."""
        return max(self.step_at, self.phase_since, self.collective_since)

    @property
    def in_collective(self) -> bool:
        return self.collectives_started > self.collectives_done


def _named(names: tuple[str, ...], code: int, unknown: str = "") -> str:
    return names[code] if 0 <= code < len(names) else unknown


def read_record(path: Path) -> RankRecord | None:
    """The record at `path`; None when it is missing, short or not (yet) a record."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    if len(data) < RECORD_SIZE:
        return None
    magic, version, pid, thread = HEADER_FIELDS.unpack_from(data, 0)
    if magic != MAGIC or version != VERSION:
        return None
    step, step_at = STEP_FIELDS.unpack_from(data, STEP_AT)
    phase, phase_since = PHASE_FIELDS.unpack_from(data, PHASE_AT)
    started, done, op, coll_since = COLLECTIVE_FIELDS.unpack_from(data, COLLECTIVE_AT)
    bad_step, bad_what = NONFINITE_FIELDS.unpack_from(data, NONFINITE_AT)
    (busy,) = BUSY_FIELDS.unpack_from(data, BUSY_AT)
    (straggler,) = STRAGGLER_FIELDS.unpack_from(data, STRAGGLER_AT)
    return RankRecord(
        rank=int(path.stem.split("-", 1)[1]),
        pid=pid,
        main_thread=thread,
        step=step,
        step_at=step_at,
        phase=_named(PHASES, phase, "?"),
        phase_since=phase_since,
        collectives_started=started,
        collectives_done=done,
        collective_op=_named(COLLECTIVES, op),
        collective_since=coll_since,
        nonfinite_step=bad_step,
        nonfinite_what=_named(NONFINITE_WHAT, bad_what),
        busy_seconds=busy,
        straggler_ratio=straggler,
        op_counts=struct.unpack_from(f"<{len(COLLECTIVES)}q", data, OP_COUNTS_AT),
    )


# ---- The flight recorder on request (a FIFO per rank beside its record) ------------------
def fr_request_path(directory: str | Path, rank: int) -> Path:
    return Path(directory) / f"rank-{rank}.fr-request"


def fr_dump_path(directory: str | Path, rank: int) -> Path:
    return Path(directory) / f"rank-{rank}.fr.json"


def request_flight_recorder(directory: str | Path, rank: int) -> bool:
    """Ask rank `rank` for a dump (launch side); False when nobody listens."""
    try:
        fd = os.open(fr_request_path(directory, rank), os.O_WRONLY | os.O_NONBLOCK)
    except OSError:  # ENXIO: no reader; ENOENT: no recorder in that rank
        return False
    try:
        os.write(fd, b"1")
    except OSError:
        return False
    finally:
        os.close(fd)
    return True


# ---- The early-exit marker ----------------------------------------------------------------
# When rank 1 of a user's program returns early, rank 0's next collective fails ("connection
# closed by peer") and, by itself, would end the pod with the retryable PEER_FAILED: retried
# forever for a deterministic bug. So each worker of a user program notes in $KUBEDDP_EXITED_DIR
# that it returned 0 (worker/program.py), and launch (launcher/agent.py) reports a failed group
# whose only cause is a lost peer as the program's own failure when a local worker had already
# returned 0 before that failure.
_EXITED_MARK = "rank-"


def note_start() -> None:
    """A (re)started worker: forget what an earlier attempt of this rank noted."""
    path = _exited_mark_path()
    if path is not None:
        with contextlib.suppress(OSError):
            path.unlink()


def note_returned() -> None:
    """This worker's program returned 0 (called only in a group of several workers)."""
    path = _exited_mark_path()
    if path is not None:
        with contextlib.suppress(OSError):
            path.write_text(repr(time.time()))


def _exited_mark_path() -> Path | None:
    folder = os.environ.get(ENV_EXITED_DIR)
    rank = os.environ.get("RANK", "")
    if not folder or not rank.isdigit() or int(os.environ.get("WORLD_SIZE", "1") or 1) < 2:
        return None
    return Path(folder) / f"{_EXITED_MARK}{int(rank)}"


def returned_before(folder: Path, failed_at: float) -> list[int]:
    """The ranks that noted a return of 0 no later than `failed_at` (seconds since the epoch;
    torch's failure timestamps are whole seconds, hence the second of slack)."""
    ranks = []
    for path in sorted(folder.glob(f"{_EXITED_MARK}*")):
        try:
            when = float(path.read_text())
        except (OSError, ValueError):
            continue
        if when <= failed_at + 1:
            ranks.append(int(path.name[len(_EXITED_MARK) :]))
    return sorted(ranks)


# ---- Rank 0's progress record for a TrainJob's status ---------------------------------------
STATUS_DIR_PREFIX = "kubeddp-status-"  # the record's folder, one per launch, under the scratch dir
# Trainer v2.3.0 trainjob_types.go Metric / TrainerStatus: the CRD rejects longer or more.
NAME_MAX = 64
VALUE_MAX = 64
METRICS_MAX = 256
# What kubeddp fills from its own arguments; a script's extra metrics come after them.
STANDARD_NAMES = ("step", "total_steps", "epoch", "total_epochs", "loss", "eval_loss")


def format_value(value: object) -> str:
    """A metric value as Trainer keeps it: a number (6 significant digits) or a short string;
    ValueError for anything else."""
    if hasattr(value, "item") and not isinstance(value, (int, float, str)):
        value = value.item()  # a 0-d tensor or a numpy scalar
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a number or a string")
    if isinstance(value, int):
        text = str(value)
    elif isinstance(value, float):
        text = f"{value:.6g}" if math.isfinite(value) else str(value)
    elif isinstance(value, str):
        text = value
    else:
        raise ValueError(f"{value!r} is not a number or a string")
    if not 1 <= len(text) <= VALUE_MAX:
        raise ValueError(f"{text[:20]!r}... must be 1 to {VALUE_MAX} characters")
    return text


def check_name(name: object) -> str:
    if not isinstance(name, str) or not 1 <= len(name) <= NAME_MAX:
        raise ValueError(f"metric name {name!r} must be a string of 1 to {NAME_MAX} characters")
    return name


def read_snapshot(path: str | Path) -> dict[str, Any] | None:
    """The latest record in `path`; None when there is none (yet) or it cannot be read."""
    try:
        record = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


# ---- Each worker's metrics: one small JSON file per worker process ---------------------------
# In $PROMETHEUS_MULTIPROC_DIR. The worker (worker/metrics.py) rewrites its file in place at
# most every 0.1 s: one pwrite, about 16 us. (A rename of a new file over it would be atomic,
# but on ext4 it waits for the new file's data to reach the disk: 1-2 ms on the training
# thread.) The record starts with "seq" and ends with "end", the same number: a read that
# overlaps a write sees them differ, or no JSON, and reads again. Launch
# (launcher/worker_metrics.py) merges every file there at each scrape. A restarted rank writes
# a new file: the old one's counts stay, so counters never go back.
WORKER_METRICS_SUFFIX = ".metrics.json"
WORKER_METRICS_VERSION = 1
_READS = 5  # tries of a file being rewritten before it is left out of this scrape


def worker_metrics_path(directory: str | Path, rank: int) -> Path:
    """A file of this worker process's own (a pid can come back after many restarts)."""
    name = f"worker-{rank}-{os.getpid()}-{secrets.token_hex(4)}{WORKER_METRICS_SUFFIX}"
    return Path(directory) / name


class WorkerMetricsFile:
    """The worker's side: its record, rewritten in place."""

    def __init__(self, path: Path) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        self.seq = 0
        self.longest = 0  # padded to the longest record so far: no old bytes stay after it

    def write(self, record: dict[str, Any]) -> None:
        self.seq += 1
        body = {"seq": self.seq, **record, "version": WORKER_METRICS_VERSION, "end": self.seq}
        data = json.dumps(body).encode()
        self.longest = max(self.longest, len(data))
        os.pwrite(self.fd, data.ljust(self.longest), 0)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)


def read_worker_metrics(directory: str | Path) -> list[dict[str, Any]]:
    """Every worker's latest record in `directory`; unreadable or foreign files left out."""
    records = []
    for path in sorted(Path(directory).glob(f"*{WORKER_METRICS_SUFFIX}")):
        record = _read_whole_record(path)
        if record is not None and record.get("version") == WORKER_METRICS_VERSION:
            records.append(record)
    return records


def _read_whole_record(path: Path) -> dict[str, Any] | None:
    for _ in range(_READS):
        try:
            record, _ = json.JSONDecoder().raw_decode(path.read_text())
        except (OSError, ValueError):
            continue  # empty (just made) or cut by a write under way: read again
        if isinstance(record, dict) and record.get("seq") == record.get("end"):
            return record
    return None
