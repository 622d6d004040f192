"""The stall report: from the ranks' heartbeat records and their faulthandler stacks, which rank
is behind, where it is stuck, and what the others wait in; one line and the full text.

Pure functions over what stall_watch.py captured (records, stacks, flight-recorder dumps), so
they are tested without processes.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass

from kubeddp.trainer.process_contract import COLLECTIVES, RankRecord

_THREAD = re.compile(r"^(?:Current thread|Thread) (0x[0-9a-fA-F]+)")
_FRAME = re.compile(r'^\s+File "(?P<file>[^"]*)", line (?P<line>\d+) in (?P<func>\S+)')
# Frames that only wait: the rank is not the cause when its innermost frame is one of these.
_WAITING_FILES = ("torch/distributed/", "torch/autograd/")


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    func: str

    def short(self) -> str:
        return f"{self.func} ({self.file.rsplit('/', 1)[-1]}:{self.line})"


@dataclass(frozen=True)
class RankState:
    record: RankRecord
    idle_seconds: float
    stacks: str  # faulthandler's dump of every thread ("" when it did not answer)
    recorder: str = ""  # the flight recorder's summary line ("" when there is none)

    def main_frames(self) -> list[Frame]:
        """The main thread's frames, innermost first."""
        return thread_frames(self.stacks, self.record.main_thread)

    def waits_for_peers(self) -> bool:
        """In a collective, or in backward waiting for the gradient all-reduce."""
        if self.record.in_collective:
            return True
        frames = self.main_frames()
        return bool(frames) and any(w in frames[0].file for w in _WAITING_FILES)

    def where(self) -> str:
        """`data: __getitem__ (faulty.py:31)`, or the collective it waits in."""
        r = self.record
        if r.in_collective:
            return f"{r.collective_op} #{r.collectives_started}"
        frames = self.main_frames()
        own = next((f for f in frames if not _is_library(f.file)), None)
        top = frames[0] if frames else None
        shown = [f.short() for f in (top, own) if f is not None]
        detail = " in ".join(dict.fromkeys(shown))
        return f"{r.phase}: {detail}" if detail else r.phase


def _is_library(path: str) -> bool:
    return "/site-packages/" in path or "/lib/python3" in path or path.startswith("<")


def thread_frames(stacks: str, thread_id: int) -> list[Frame]:
    """The frames faulthandler listed for `thread_id` (innermost first); the last dump wins."""
    frames: list[Frame] = []
    current = None
    for line in stacks.splitlines():
        head = _THREAD.match(line)
        if head:
            current = int(head.group(1), 16)
            if current == thread_id:
                frames = []
            continue
        m = _FRAME.match(line)
        if m and current == thread_id:
            frames.append(Frame(m["file"], int(m["line"]), m["func"]))
    return frames


@dataclass(frozen=True)
class StallReport:
    line: str
    text: str
    lagging_rank: int | None


def build_report(states: list[RankState], where: str, stall_seconds: float) -> StallReport:
    """`where` is this pod and node ("pod j-worker-2, node n7")."""
    waiting = [s for s in states if s.waits_for_peers()]
    suspects = [s for s in states if not s.waits_for_peers()]
    behind = _behind_in_collectives(states)
    why = ""
    if suspects:
        lagging = max(suspects, key=lambda s: s.idle_seconds)
        if behind is not None and behind[0] is lagging:
            why = behind[1]
    elif behind is not None:
        lagging, why = behind
    else:
        lagging = None
    waits = _describe_waits([s for s in waiting if s is not lagging])
    if lagging is not None:
        r = lagging.record
        line = (
            f"rank {r.rank} ({where}) has been in {lagging.where()} for "
            f"{lagging.idle_seconds:.0f} s"
        )
        if why:
            line += f" ({why})"
    else:
        ranks = ", ".join(str(s.record.rank) for s in states)
        line = (
            f"ranks {ranks} ({where}) made no progress for {stall_seconds:g} s; no local rank "
            "lags (the rank they wait for runs in another pod: see its report)"
        )
    if waits:
        line += f"; {waits}"
    body = [f"stall report: {line}", ""]
    for s in sorted(states, key=lambda s: s.record.rank):
        r = s.record
        body.append(
            f"rank {r.rank} (pid {r.pid}): step {r.step}, {s.where()}, no progress for "
            f"{s.idle_seconds:.0f} s, collectives {r.collectives_done}/{r.collectives_started} "
            f"(last {r.collective_op or '-'})"
        )
        if s.recorder:
            body.append(s.recorder)
        body.append(s.stacks.rstrip() or "  (no stacks: the process did not answer)")
        body.append("")
    number = lagging.record.rank if lagging is not None else None
    return StallReport(line, "\n".join(body), number)


def _behind_in_collectives(states: list[RankState]) -> tuple[RankState, str] | None:
    """A rank that started fewer collectives than the others (it skipped one, or has not
    reached the one they wait in), and why it is named."""
    if len(states) < 2:
        return None
    counts = Counter(s.record.collectives_started for s in states)
    lowest = min(states, key=lambda s: s.record.collectives_started)
    if len(counts) > 1 and counts[lowest.record.collectives_started] == 1:
        most = max(s.record.collectives_started for s in states)
        return (
            lowest,
            f"it started {lowest.record.collectives_started} collectives, the others {most}",
        )
    for op, name in enumerate(COLLECTIVES):  # the same total: one op fewer, another more
        per_rank = Counter(s.record.op_counts[op] for s in states)
        if len(per_rank) < 2:
            continue
        few = min(states, key=lambda s: s.record.op_counts[op])
        if per_rank[few.record.op_counts[op]] == 1:
            most = max(s.record.op_counts[op] for s in states)
            return few, f"it ran {few.record.op_counts[op]} {name}, the others {most}"
    return None


def _describe_waits(waiting: list[RankState]) -> str:
    if not waiting:
        return ""
    groups = Counter(_wait_name(s) for s in waiting)
    parts = []
    for name, count in groups.most_common():
        parts.append(
            f"{count} rank{'s' if count > 1 else ''} wait{'' if count > 1 else 's'} in {name}"
        )
    return ", ".join(parts)


def _wait_name(state: RankState) -> str:
    r = state.record
    if r.in_collective:
        return f"{r.collective_op} #{r.collectives_started}"
    last = f" (after {r.collective_op} #{r.collectives_started})" if r.collective_op else ""
    return f"the gradient all-reduce{last}"


def flight_recorder_summary(text: str) -> str:
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
