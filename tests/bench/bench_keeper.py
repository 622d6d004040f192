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
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from kubeddp.trainer.keeper.auth import Secret
from kubeddp.trainer.keeper.client import KeeperClient
from kubeddp.trainer.keeper.sync import CheckpointSync, SyncSettings
from tests.bench.common import PYTHON, REPO_ROOT, BenchError, Row, free_port, median, spread

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


def cp_fsync(source: Path, dest: Path, cpu: list[float] | None = None) -> float:
    """Seconds for `cp -r` of the checkpoint directory and fsync of every file and folder (the
    CPU they took is added to `cpu`)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    before = own_cpu_seconds(), own_cpu_seconds(children=True)
    start = time.perf_counter()
    subprocess.run(["cp", "-r", str(source), str(dest)], check=True, timeout=3600)
    _fsync_tree(dest)
    took = time.perf_counter() - start
    if cpu is not None:
        cpu.append(own_cpu_seconds() - before[0] + own_cpu_seconds(children=True) - before[1])
    return took


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


def measure_size(work: Path, size: int, reps: int) -> dict:
    """cp + fsync and the keeper, push and fetch of one checkpoint of `size` bytes."""
    pod, claim = work / "pod", work / "claim"
    unit = make_checkpoint(pod, size)
    times: dict[str, list[float]] = {"cp_push": [], "push": [], "cp_fetch": [], "fetch": []}
    cp_cpu: dict[str, list[float]] = {"push": [], "fetch": []}
    with keeper(claim, work) as (proc, url, secret):
        meters = {"push": CpuMeter(proc.pid), "fetch": CpuMeter(proc.pid)}
        for _ in range(reps):
            times["cp_push"].append(cp_fsync(unit, work / "cp-push" / unit.name, cp_cpu["push"]))
            shutil.rmtree(work / "cp-push")
            with meters["push"].measuring():
                times["push"].append(_timed_push(url, secret, pod))
            cp_fetch = work / "cp-fetch" / unit.name
            times["cp_fetch"].append(cp_fsync(claim / unit.name, cp_fetch, cp_cpu["fetch"]))
            shutil.rmtree(work / "cp-fetch")
            with meters["fetch"].measuring():
                times["fetch"].append(_timed_fetch(url, secret, work / "fetched"))
            shutil.rmtree(work / "fetched")
            shutil.rmtree(claim / unit.name)  # the next push is a new checkpoint again
    shutil.rmtree(pod)
    gib = size * reps / GIB
    cpu = {
        way: {"keeper": m.keeper / gib, "pod": m.pod / gib, "cp": sum(cp_cpu[way]) / gib}
        for way, m in meters.items()
    }
    return {"size": size, "times": times, "cpu_per_gib": cpu}


def size_rows(result: dict) -> list[Row]:
    size, times, cpu = result["size"], result["times"], result["cpu_per_gib"]
    label = f"{size / GIB:g} GiB" if size >= GIB else f"{size >> 20} MiB"
    rows = []
    for way, base in (("push", "cp_push"), ("fetch", "cp_fetch")):
        ratios = [b / k for b, k in zip(times[base], times[way], strict=True)]
        rows.append(
            Row(
                SECTION,
                f"{way} of a {label} checkpoint: keeper / cp + fsync",
                median(times[base]) / median(times[way]),
                "cp -r + fsync of the same files on the same disk, alternating in one run",
                f"keeper {_rate(size, median(times[way]))} ({median(times[way]):.1f} s), cp + "
                f"fsync {_rate(size, median(times[base]))}; CPU s/GiB: keeper "
                f"{cpu[way]['keeper']:.2f}, pod {cpu[way]['pod']:.2f} (cp {cpu[way]['cp']:.2f})",
                GOAL,
                spread(ratios)
                + (
                    "; the fetch does not fsync (an emptyDir is gone with its pod)"
                    if way == "fetch"
                    else ""
                ),
                {
                    "seconds": times[way],
                    "baseline_seconds": times[base],
                    "cpu_s_per_gib": cpu[way]["keeper"],
                    "pod_cpu_s_per_gib": cpu[way]["pod"],
                    "cp_cpu_s_per_gib": cpu[way]["cp"],
                },
            )
        )
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
    """For comparison only: an rsync daemon (Debian's rsync) moving the same checkpoint."""
    if shutil.which("rsync") is None:
        return [
            Row(SECTION, "rsync daemon push / cp + fsync", None, "", note="rsync not installed")
        ]
    pod, claim = work / "rsync-pod", work / "rsync-claim"
    unit = make_checkpoint(pod, size)
    claim.mkdir()
    port = free_port()
    conf = work / "rsyncd.conf"
    conf.write_text(f"pid file = {work}/rsyncd.pid\nport = {port}\nuse chroot = false\n"
                    f"[claim]\n path = {claim}\n read only = false\n")  # fmt: skip
    daemon = subprocess.Popen(["rsync", "--daemon", "--no-detach", f"--config={conf}"])
    time.sleep(1.0)
    base, took = [], []
    try:
        for _ in range(reps):
            base.append(cp_fsync(unit, work / "cp-rsync" / unit.name))
            shutil.rmtree(work / "cp-rsync")
            start = time.perf_counter()
            target = f"rsync://127.0.0.1:{port}/claim/"
            argv = ["rsync", "-a", "--whole-file", "--fsync", str(unit), target]
            subprocess.run(argv, check=True, timeout=3600)
            took.append(time.perf_counter() - start)
            shutil.rmtree(claim / unit.name)
    finally:
        daemon.kill()
        daemon.wait()
        shutil.rmtree(pod)
    return [Row(SECTION, f"rsync daemon push of {size >> 20} MiB / cp + fsync (comparison)",
                median(base) / median(took), "cp -r + fsync, alternating",
                f"rsync {_rate(size, median(took))}", "", spread(
                    [b / t for b, t in zip(base, took, strict=True)]))]  # fmt: skip


def bench_keeper(
    work: Path, sizes_mib: list[int], reps: int, pods_mib: int, rsync: bool = False
) -> list[Row]:
    work = work / "keeper"
    work.mkdir(parents=True, exist_ok=True)
    rows: list[Row] = []
    try:
        for mib in sizes_mib:
            rows += size_rows(measure_size(work, mib << 20, reps))
        for readers in (1, PODS):
            rows.append(pods_row(pods_at_once(work, pods_mib << 20, readers)))
        if rsync:
            rows += rsync_rows(work, sizes_mib[0] << 20, reps)
    except (OSError, RuntimeError, subprocess.SubprocessError, ValueError) as exc:
        raise BenchError(f"{type(exc).__name__}: {exc}") from exc
    finally:
        shutil.rmtree(work, ignore_errors=True)  # several GiB
    return rows


def _fill(url: str, secret: str, dest: str, reads: str) -> None:
    """One pod of pods_at_once: fill its directory, say what it moved."""
    sync = _sync(url, Path(secret), Path(dest), reads == "1")
    start = time.perf_counter()
    sync.fill()
    print(json.dumps({"moved": sync.client.moved_bytes, "seconds": time.perf_counter() - start}))


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
        for row in bench_keeper(work, sizes, args.reps, args.pods_mib, args.rsync):
            ratio = f"{row.ratio:.3f}" if row.ratio is not None else "-"
            print(f"{row.name}: {ratio} ({row.goal}) | {row.absolute} | {row.note}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
