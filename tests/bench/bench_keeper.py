"""The checkpoint keeper against `cp` + fsync of the same checkpoint files on the same disk, in
one run: a pod's send of one checkpoint (push), a starting pod's fetch, 8 pods starting at
once, and the CPU-seconds per GiB moved on each side: the keeper's process, the pod's (this
process, which runs the pod's sync code and nothing else meanwhile) and `cp`'s. CPU per GiB
hardly depends on what else the machine runs; the wall-clock ratio does.

    python -m tests.bench.bench_keeper --sizes-mib 1024,4096 [--reps 2] [--rsync]

A real `kubeddp keeper` process (with a secret), the pods' real sync code, real `cp`; the
checkpoint is written by the real writer (digests in COMPLETE) with incompressible bytes. Each
repeat runs cp, then the keeper (ABAB): both meet the same page cache and the same neighbours.
With --rsync (and rsync installed) an rsync daemon on the same files, for comparison.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from kubeddp.trainer.keeper.auth import Secret
from kubeddp.trainer.keeper.client import KeeperClient
from kubeddp.trainer.keeper.sync import CheckpointSync, SyncSettings
from tests.bench.common import (
    PYTHON,
    REPO_ROOT,
    BenchError,
    Row,
    median,
    not_measured,
    paired,
    spread,
)
from tests.helpers.ports import free_port

SECTION = "keeper"
GOAL = ">= 0.8"
PODS = 8
GIB = float(1 << 30)
PATTERN_BYTES = 64 << 20


def _write_state(size: int):  # noqa: ANN202 - a WriteBody
    pattern = os.urandom(PATTERN_BYTES)  # incompressible; one allocation, repeated

    def body(f) -> None:  # noqa: ANN001
        left = size
        while left:
            left -= f.write(memoryview(pattern)[: min(left, PATTERN_BYTES)])

    return body


def make_checkpoint(directory: Path, size: int, step: int = 1) -> Path:
    """A checkpoint of `size` bytes (state.pt) as the trainer writes it."""
    # here, not at the top: the 8 pods' processes (--fill) would each import torch for nothing
    from kubeddp.trainer.worker.checkpoint.local import LocalStorage

    ref = LocalStorage(directory).write(
        step, {"state.pt": _write_state(size), "config.yaml": lambda f: f.write(b"a: 1\n")}
    )
    return Path(ref.path)


def _fsync_tree(root: Path) -> None:
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)
        fd = os.open(dirpath, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
    fd = os.open(root.parent, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)


def own_cpu_seconds(children: bool = False) -> float:
    """User + system CPU of this process (all its threads), or of its finished children."""
    t = os.times()
    return t.children_user + t.children_system if children else t.user + t.system


def cp_fsync(source: Path, dest: Path) -> tuple[float, float]:
    """`cp -r` of the checkpoint directory and fsync of every file and folder: (seconds, the
    CPU-seconds they took)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    before = own_cpu_seconds(), own_cpu_seconds(children=True)
    start = time.perf_counter()
    subprocess.run(["cp", "-r", str(source), str(dest)], check=True, timeout=3600)
    _fsync_tree(dest)
    took = time.perf_counter() - start
    return took, own_cpu_seconds() - before[0] + own_cpu_seconds(children=True) - before[1]


def tcp_copy(source: Path, dest: Path, fsync: bool = True) -> tuple[float, float, float]:
    """The minimal TCP + digest (+ fsync) copy (tests/bench/tcp_copy.py) of the checkpoint
    directory `source` to `dest`, sender and receiver in their own processes: (seconds from
    the sender's connect to the receiver's last fsync, the sender's CPU-s, the receiver's)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    port_file = dest.parent / f".{dest.name}.port"
    port_file.unlink(missing_ok=True)
    module = [PYTHON, "-m", "tests.bench.tcp_copy"]
    argv = [*module, "receive" if fsync else "receive-no-fsync", str(dest), str(port_file)]
    receiver = subprocess.Popen(argv, cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True)
    try:
        end = time.monotonic() + 60
        while not port_file.exists() or not port_file.read_text():
            if receiver.poll() is not None or time.monotonic() > end:
                raise BenchError("the TCP copy's receiver did not start")
            time.sleep(0.02)
        sent = subprocess.run([*module, "send", str(source), port_file.read_text()],
                              cwd=REPO_ROOT, check=True, timeout=3600, capture_output=True,
                              text=True)  # fmt: skip
        out, _ = receiver.communicate(timeout=3600)
        if receiver.returncode:
            raise BenchError(f"the TCP copy's receiver failed ({receiver.returncode})")
    finally:
        if receiver.poll() is None:
            receiver.kill()
            receiver.wait()
        port_file.unlink(missing_ok=True)
    send, got = json.loads(sent.stdout), json.loads(out)
    return got["end"] - send["start"], send["cpu"], got["cpu"]


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class CpuMeter:
    """The keeper's and this process's (the pod's) CPU-seconds over the blocks measured."""

    def __init__(self, keeper_pid: int) -> None:
        self.pid, self.keeper, self.pod = keeper_pid, 0.0, 0.0

    @contextlib.contextmanager
    def measuring(self) -> Iterator[None]:
        keeper, pod = cpu_seconds(self.pid), own_cpu_seconds()
        yield
        self.keeper += cpu_seconds(self.pid) - keeper
        self.pod += own_cpu_seconds() - pod


@contextlib.contextmanager
def keeper(claim: Path, work: Path) -> Iterator[tuple[subprocess.Popen, str, Path]]:
    """A keeper process serving `claim` with a fresh secret: (process, url, secret file)."""
    secret = work / "keeper-secret"
    secret.write_text(secrets.token_urlsafe(32))
    port = free_port()
    argv = [PYTHON, "-m", "kubeddp", "keeper", "--dir", str(claim), "--port", str(port),
            "--bind", "127.0.0.1", "--token-file", str(secret)]  # fmt: skip
    with open(work / "keeper.log", "ab") as log:
        proc = subprocess.Popen(argv, cwd=REPO_ROOT, stdout=log, stderr=log, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        client = KeeperClient(url, timeout=5)
        end = time.monotonic() + 60
        while not client.healthy():
            if proc.poll() is not None or time.monotonic() > end:
                raise BenchError(f"the keeper did not start; log {work / 'keeper.log'}")
            time.sleep(0.1)
        yield proc, url, secret
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 9)
        proc.wait()


def _sync(url: str, secret: Path, root: Path, reads: bool = True) -> CheckpointSync:
    client = KeeperClient(url, Secret.from_file(str(secret)))
    return CheckpointSync(client, root, lambda line: None, SyncSettings(reads=reads, pod="bench"))


def _timed_push(url: str, secret: Path, pod: Path) -> float:
    sync = _sync(url, secret, pod)
    start = time.perf_counter()
    sent = sync.push(final=True)
    took = time.perf_counter() - start
    sync.client.close()
    if not any(item.startswith("ckpt-") for item in sent):
        raise BenchError(f"the push sent {sent}, not the checkpoint")
    return took


def _timed_fetch(url: str, secret: Path, dest: Path) -> float:
    sync = _sync(url, secret, dest)
    start = time.perf_counter()
    said = sync.fill()
    took = time.perf_counter() - start
    sync.client.close()
    if not said or not said.startswith("checkpoint "):
        raise BenchError(f"the fetch got {said!r}, not the checkpoint")
    return took


def _rate(size: int, seconds: float) -> str:
    return f"{size / seconds / 1e6:.0f} MB/s"


def _label(size: int) -> str:
    return f"{size / GIB:g} GiB" if size >= GIB else f"{size >> 20} MiB"


def measure_size(work: Path, size: int, reps: int) -> dict:
    """The keeper's push and fetch of one checkpoint of `size` bytes against the minimal TCP
    copy (and cp + fsync, for context), the arms of each repeat in a rotating order: seconds
    and CPU-seconds per arm and repeat."""
    pod, claim, copies = work / "pod", work / "claim", work / "copies"
    unit = make_checkpoint(pod, size)
    times: dict[str, dict[str, list[float]]] = {"push": {}, "fetch": {}}
    cpu: dict[str, dict[str, list[float]]] = {"push": {}, "fetch": {}}

    def record(way: str, arm: str, seconds: float, **spent: float) -> None:
        times[way].setdefault(arm, []).append(seconds)
        for side, value in spent.items():
            cpu[way].setdefault(f"{arm}.{side}", []).append(value)

    with keeper(claim, work) as (proc, url, secret):

        def push() -> None:
            meter = CpuMeter(proc.pid)
            with meter.measuring():
                took = _timed_push(url, secret, pod)
            record("push", "keeper", took, pod=meter.pod, keeper=meter.keeper)

        def fetch() -> None:
            meter = CpuMeter(proc.pid)
            with meter.measuring():
                took = _timed_fetch(url, secret, work / "fetched")
            shutil.rmtree(work / "fetched")
            record("fetch", "keeper", took, pod=meter.pod, keeper=meter.keeper)

        def copy(way: str, source: Path, arm: str) -> Callable[[], None]:
            def run() -> None:
                dest = copies / unit.name
                if arm == "cp":
                    took, spent = cp_fsync(source, dest)
                    record(way, arm, took, cp=spent)
                else:
                    took, sender, receiver = tcp_copy(source, dest, fsync=arm == "tcp")
                    record(way, arm, took, sender=sender, receiver=receiver)
                shutil.rmtree(copies)

            return run

        for rep in range(reps):
            arms = [push, copy("push", unit, "tcp"), copy("push", unit, "cp")]
            for run in arms[rep % 3 :] + arms[: rep % 3]:
                run()
            source = claim / unit.name  # what the keeper pushed: its copy on the claim
            arms = [fetch, copy("fetch", source, "tcp"), copy("fetch", source, "tcp-no-fsync"),
                    copy("fetch", source, "cp")]  # fmt: skip
            for run in arms[rep % 4 :] + arms[: rep % 4]:
                run()
            shutil.rmtree(source)  # the next push is a new checkpoint again
    shutil.rmtree(pod)
    gib = size / GIB
    per_gib = {way: {k: [v / gib for v in vs] for k, vs in got.items()} for way, got in cpu.items()}
    return {"size": size, "times": times, "cpu_per_gib": per_gib}


def size_rows(result: dict) -> list[Row]:
    """One row per way: keeper / minimal TCP copy (the goal), the median repeat's two rates in
    the absolute column (common.paired), cp + fsync and the CPU per GiB of every side beside."""
    size, rows = result["size"], []
    for way in ("push", "fetch"):
        times, cpu = result["times"][way], result["cpu_per_gib"][way]
        ratio = {arm: [b / k for b, k in zip(times[arm], times["keeper"], strict=True)]
                 for arm in times if arm != "keeper"}  # fmt: skip
        c = {key: median(values) for key, values in cpu.items()}
        pod_side, keeper_side = ("sender", "receiver") if way == "push" else ("receiver", "sender")
        fsync = (
            "the keeper fsyncs every file and folder before it commits"
            if way == "push"
            else "the keeper's fetch does not fsync (an emptyDir is gone with its pod)"
        )
        rates = [(size / k / 1e6, size / t / 1e6) for k, t in zip(times["keeper"], times["tcp"],
                                                                   strict=True)]  # fmt: skip
        others = [f"keeper / cp + fsync {median(ratio['cp']):.2f} ({spread(ratio['cp'])}, cp "
                  f"{_rate(size, median(times['cp']))})"]  # fmt: skip
        if "tcp-no-fsync" in ratio:
            others.append(f"keeper / TCP copy without fsync {median(ratio['tcp-no-fsync']):.2f} "
                          f"({spread(ratio['tcp-no-fsync'])})")  # fmt: skip
        row = paired(
            SECTION,
            f"{way} of a {_label(size)} checkpoint: keeper / TCP + BLAKE3 + fsync copy",
            "tests/bench/tcp_copy.py: sendfile over loopback TCP, the same BLAKE3 block "
            "digests, write + fsync, same files and disk, arms alternating in one run",
            rates,
            "MB/s",
            GOAL,
            "; ".join([*others, fsync]),
        )
        row.absolute += (
            f"; CPU s/GiB (medians): pod {c['keeper.pod']:.2f}, keeper {c['keeper.keeper']:.2f}; "
            f"TCP copy {pod_side} {c[f'tcp.{pod_side}']:.2f}, {keeper_side} "
            f"{c[f'tcp.{keeper_side}']:.2f}; cp {c['cp.cp']:.2f}"
        )
        row.extra.update(
            {
                "seconds": times,
                "ratios_by_arm": ratio,
                "cpu_s_per_gib": cpu,
                "pod_cpu_s_per_gib": c["keeper.pod"],
                "keeper_cpu_s_per_gib": c["keeper.keeper"],
            }
        )
        rows.append(row)
    return rows


def pods_at_once(work: Path, size: int, readers: int) -> dict:
    """8 pods fetching at once from one keeper, `readers` of them reading the checkpoint: the
    bytes that went through the keeper, and the slowest pod's seconds."""
    claim = work / "claim-8"
    unit = make_checkpoint(claim, size)
    unit_bytes = sum(f.stat().st_size for f in unit.iterdir())  # state.pt, config, COMPLETE
    with keeper(claim, work) as (proc, url, secret):
        before = cpu_seconds(proc.pid)
        argv = [PYTHON, "-m", "tests.bench.bench_keeper", "--fill", url, str(secret)]
        procs = [
            subprocess.Popen(
                [*argv, str(work / f"pod-{i}"), "1" if i < readers else "0"],
                cwd=REPO_ROOT,
                stdout=subprocess.PIPE,
                text=True,
            )  # fmt: skip
            for i in range(PODS)
        ]
        answers = [json.loads(p.communicate(timeout=3600)[0]) for p in procs]
        cpu = cpu_seconds(proc.pid) - before
    for i in range(PODS):
        shutil.rmtree(work / f"pod-{i}", ignore_errors=True)
    shutil.rmtree(claim)
    moved = sum(a["moved"] for a in answers)
    return {"moved": moved, "seconds": max(a["seconds"] for a in answers), "cpu": cpu,
            "readers": readers, "size": unit_bytes}  # fmt: skip


def pods_row(result: dict) -> Row:
    size, readers, moved = result["size"], result["readers"], result["moved"]
    allowed = readers * size
    who = "the built-in trainer: only the pod of rank 0 reads" if readers == 1 else (
        "a script that loads on every rank: every pod reads")  # fmt: skip
    return Row(
        SECTION,
        f"{PODS} pods starting at once, {readers} reading: (readers x checkpoint) / moved",
        allowed / moved if moved else None,
        f"{readers} x the checkpoint ({size / 1e6:.1f} MB), the most the keeper may move",
        f"{moved / 1e6:.0f} MB moved in {result['seconds']:.1f} s (slowest pod); keeper CPU "
        f"{result['cpu']:.2f} s",
        ">= 1",
        who,
        dict(result),
    )


def rsync_rows(work: Path, size: int, reps: int) -> list[Row]:
    """For comparison only: an rsync daemon (Debian's rsync) receiving the same checkpoint,
    alternating with the minimal TCP copy. The daemon writes as the user running the bench
    (`uid`/`gid` in its module: run as root it would otherwise drop to nobody, who cannot write
    the claim)."""
    name = f"rsync daemon push of {_label(size)} / TCP + BLAKE3 + fsync copy (comparison)"
    if shutil.which("rsync") is None:
        return [not_measured(SECTION, name, "rsync is not installed")]
    pod, claim, copies = work / "rsync-pod", work / "rsync-claim", work / "rsync-copies"
    unit = make_checkpoint(pod, size)
    claim.mkdir()
    port = free_port()
    conf = work / "rsyncd.conf"
    conf.write_text(f"pid file = {work}/rsyncd.pid\nport = {port}\naddress = 127.0.0.1\n"
                    f"use chroot = false\n[claim]\n path = {claim}\n read only = false\n"
                    f" uid = {os.getuid()}\n gid = {os.getgid()}\n")  # fmt: skip
    log = work / "rsyncd.log"
    argv = ["rsync", "--daemon", "--no-detach", f"--config={conf}", f"--log-file={log}"]
    daemon = subprocess.Popen(argv, start_new_session=True)
    base, took = [], []
    try:
        _wait_for_port(port, daemon, log)
        for rep in range(reps):
            for arm in ("tcp", "rsync") if rep % 2 == 0 else ("rsync", "tcp"):
                if arm == "tcp":
                    base.append(tcp_copy(unit, copies / unit.name)[0])
                    shutil.rmtree(copies)
                    continue
                start = time.perf_counter()
                target = f"rsync://127.0.0.1:{port}/claim/"
                argv = ["rsync", "-a", "--whole-file", "--fsync", str(unit), target]
                done = subprocess.run(argv, timeout=3600, capture_output=True, text=True)
                if done.returncode:
                    raise BenchError(f"rsync exit {done.returncode}: {done.stderr.strip()[-300:]}")
                took.append(time.perf_counter() - start)
                shutil.rmtree(claim / unit.name)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(daemon.pid, 9)
        daemon.wait()
        shutil.rmtree(pod)
    ratios = [b / t for b, t in zip(base, took, strict=True)]
    return [Row(SECTION, name, median(ratios), "tests/bench/tcp_copy.py, alternating",
                f"rsync {_rate(size, median(took))}, TCP copy {_rate(size, median(base))}", "",
                spread(ratios) + "; rsync -a --whole-file --fsync, no digests of its own "
                "beyond its whole-file checksum")]  # fmt: skip


def _wait_for_port(port: int, proc: subprocess.Popen, log: Path) -> None:
    end = time.monotonic() + 30
    while True:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
            return
        if proc.poll() is not None or time.monotonic() > end:
            said = log.read_text(errors="replace").strip()[-300:] if log.exists() else ""
            raise BenchError(f"the rsync daemon did not listen on {port}: {said}")
        time.sleep(0.05)


FAILURES = (BenchError, OSError, RuntimeError, subprocess.SubprocessError, ValueError, KeyError)


def bench_keeper(
    work: Path,
    sizes_mib: list[int],
    reps: int,
    pods_mib: int,
    rsync: bool = False,
    emit: Callable[[Row], None] = lambda row: None,
) -> list[Row]:
    """Every row, each handed to `emit` as soon as it is measured; a part that fails becomes a
    'not measured' row naming the error, and the other parts still run."""
    work = work / "keeper"
    work.mkdir(parents=True, exist_ok=True)
    rows: list[Row] = []
    parts: list[tuple[str, Callable[[], list[Row]]]] = [
        (f"push and fetch of {_label(mib << 20)}",
         lambda mib=mib: size_rows(measure_size(work, mib << 20, reps)))
        for mib in sizes_mib
    ]  # fmt: skip
    parts += [
        (f"{PODS} pods starting at once, {readers} reading",
         lambda readers=readers: [pods_row(pods_at_once(work, pods_mib << 20, readers))])
        for readers in (1, PODS)
    ]  # fmt: skip
    if rsync:
        parts.append(("rsync daemon push", lambda: rsync_rows(work, sizes_mib[0] << 20, reps)))
    try:
        for name, part in parts:
            try:
                got = part()
            except FAILURES as exc:
                got = [not_measured(SECTION, name, f"failed: {type(exc).__name__}: {exc}")]
            for row in got:
                emit(row)
            rows += got
            for leftover in work.iterdir():  # what a failed part left: the next starts clean
                if leftover.is_dir():
                    shutil.rmtree(leftover, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)  # several GiB
    return rows


def _fill(url: str, secret: str, dest: str, reads: str) -> None:
    """One pod of pods_at_once: fill its directory, say what it moved."""
    sync = _sync(url, Path(secret), Path(dest), reads == "1")
    start = time.perf_counter()
    sync.fill()
    print(json.dumps({"moved": sync.client.moved_bytes, "seconds": time.perf_counter() - start}))


def _print_row(row: Row) -> None:
    ratio = f"{row.ratio:.3f}" if row.ratio is not None else "not measured"
    print(f"{row.name}: {ratio} ({row.goal}) | {row.absolute} | {row.note}", flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes-mib", default="1024,4096")
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--pods-mib", type=int, default=256)
    p.add_argument("--rsync", action="store_true")
    p.add_argument("--work", default="")
    p.add_argument("--fill", nargs=4, metavar=("URL", "SECRET", "DIR", "READS"))
    args = p.parse_args(argv)
    if args.fill:
        _fill(*args.fill)
        return 0
    sizes = [int(x) for x in args.sizes_mib.split(",") if x]
    with contextlib.ExitStack() as stack:
        temporary = tempfile.TemporaryDirectory(prefix="kubeddp-keeper-bench-")
        work = Path(args.work) if args.work else Path(stack.enter_context(temporary))
        bench_keeper(work, sizes, args.reps, args.pods_mib, args.rsync, _print_row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
