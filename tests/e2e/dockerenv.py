"""A Docker engine, an offline base image and the kubeddp CPU image, made on this machine.

No registry is reachable here, so the base image is a Debian bookworm root filesystem made by
debootstrap and loaded with `docker import`, and every wheel the image needs is downloaded on
the host (PyPI is reachable from the host, not from containers) and built with
`--network none`. What is slow and does not depend on the checkout (the base image's tarball,
the wheels) is cached under KUBEDDP_TEST_CACHE (default /var/cache/kubeddp-test), never in
the repository.

Run `python tests/e2e/dockerenv.py` to do the whole set-up by hand and print the image tag.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CACHE_DIR = Path(os.environ.get("KUBEDDP_TEST_CACHE", "/var/cache/kubeddp-test"))
BASE_IMAGE = "kubeddp-base:bookworm"
LOCK = REPO / "requirements" / "image.lock"  # the image's hash-locked Python packages
IMAGE = "kubeddp:e2e-cpu"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
BASE_PACKAGES = "python3,python3-venv,tini,ca-certificates"
BASE_PYTHON = (3, 11)  # bookworm's python3: the wheels downloaded on the host must match it
TORCH_VERSION = "2.13.0"
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
# Label on every container and network a test creates, so leftovers of a killed run are found.
TEST_LABEL = "io.kubeddp.e2e"
# Test networks use TEST-NET-2 (RFC 5737): never a real address, never the host's own range.
# (Not TEST-NET-3: a sandbox may serve its package index from 203.0.113.x, and a test network
# holding that address on the host would cut pip off while it exists.)
TEST_SUBNET = "198.51.100.0/24"
DOCKERD_WAIT_SECONDS = 60.0


class DockerSetupError(RuntimeError):
    """The Docker engine or the test image could not be made; the message says which step."""


@dataclass
class StepTimes:
    """Seconds each set-up step took, reported at the end of the test session."""

    seconds: dict[str, float] = field(default_factory=dict)

    def run(self, name: str, step: Callable[[], object]) -> None:
        start = time.monotonic()
        step()
        self.seconds[name] = time.monotonic() - start

    def summary(self) -> str:
        return ", ".join(f"{name} {sec:.1f}s" for name, sec in self.seconds.items())


def sh(
    *cmd: str | Path, timeout: float = 120, env: dict | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run a command, capture its output; on failure raise with the command and its output."""
    args = [str(c) for c in cmd]
    proc = subprocess.run(
        args, capture_output=True, text=True, timeout=timeout, env=env, stdin=subprocess.DEVNULL
    )
    if check and proc.returncode != 0:
        output = (proc.stdout + proc.stderr)[-4000:]
        raise DockerSetupError(f"`{' '.join(args)}` exited {proc.returncode}:\n{output}")
    return proc


def ensure_packages() -> None:
    """Install Debian's docker.io and debootstrap when they are missing."""
    missing = [tool for tool in ("dockerd", "debootstrap") if shutil.which(tool) is None]
    if shutil.which("docker") is None and "dockerd" not in missing:
        missing.append("docker")
    if not missing:
        return
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    sh("apt-get", "update", timeout=600, env=env)
    sh(
        "apt-get",
        "install",
        "-y",
        "--no-install-recommends",
        "docker.io",
        "debootstrap",
        "tar",
        timeout=900,
        env=env,
    )


def _docker_answers() -> bool:
    return sh("docker", "version", timeout=30, check=False).returncode == 0


def _pin_api_version() -> None:
    """A client newer than Debian's 20.10 daemon sometimes refuses it: speak the daemon's API."""
    proc = sh("docker", "version", "--format", "{{.Server.APIVersion}}", timeout=30, check=False)
    if proc.returncode == 0 or "DOCKER_API_VERSION" in os.environ:
        return
    marker = "Maximum supported API version is "
    text = proc.stderr
    if marker in text:
        os.environ["DOCKER_API_VERSION"] = text.split(marker, 1)[1].split()[0].strip(".,")


def ensure_dockerd() -> None:
    """Start dockerd in the background unless an engine already answers.

    Flags: no default bridge, no iptables rules, no IP forwarding: containers reach nothing
    outside the machine, and the host's network is left as it was. Containers on a
    user-defined (`--internal`) network still reach each other by name.
    """
    _pin_api_version()
    if _docker_answers():
        return
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    log_path = CACHE_DIR / "dockerd.log"
    with open(log_path, "ab") as log:
        subprocess.Popen(
            ["dockerd", "--iptables=false", "--ip-forward=false", "--bridge=none"],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # outlives the test session: the next run reuses it
        )
    deadline = time.monotonic() + DOCKERD_WAIT_SECONDS
    while time.monotonic() < deadline:
        _pin_api_version()
        if _docker_answers():
            return
        time.sleep(1)
    tail = log_path.read_text(errors="replace")[-3000:]
    raise DockerSetupError(
        f"dockerd did not answer within {DOCKERD_WAIT_SECONDS:.0f}s; its log {log_path}:\n{tail}"
    )


def _image_exists(tag: str) -> bool:
    return sh("docker", "image", "inspect", tag, timeout=30, check=False).returncode == 0


def ensure_base_image() -> None:
    """`kubeddp-base:bookworm`: debootstrap minbase + python3, venv, tini, CA certificates."""
    if _image_exists(BASE_IMAGE):
        return
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    tarball = CACHE_DIR / "kubeddp-base-bookworm.tar"
    if not tarball.exists():
        rootfs = CACHE_DIR / "rootfs.partial"
        shutil.rmtree(rootfs, ignore_errors=True)
        sh(
            "debootstrap",
            "--variant=minbase",
            f"--include={BASE_PACKAGES}",
            "bookworm",
            rootfs,
            DEBIAN_MIRROR,
            timeout=1200,
        )
        # The image needs no package cache: apt cannot reach a mirror from a container anyway.
        for cache in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for entry in (rootfs / cache).glob("*"):
                if entry.is_file():
                    entry.unlink()
        partial = tarball.with_suffix(".tar.partial")
        sh("tar", "-C", rootfs, "-cf", partial, ".", timeout=600)
        partial.rename(tarball)
        shutil.rmtree(rootfs, ignore_errors=True)
    sh("docker", "import", tarball, BASE_IMAGE, timeout=600)


def wheel_dir() -> Path:
    return CACHE_DIR / "wheels"


def _torch_cpu_source() -> list[str]:
    """The CPU torch wheel: from a local wheel folder in $PIP_FIND_LINKS when one has it (no
    registry is asked), else from PyTorch's CPU index (PyPI's Linux x86_64 torch is the CUDA
    build, which needs 3 GB of CUDA libraries the CPU image must not carry)."""
    for folder in os.environ.get("PIP_FIND_LINKS", "").split():
        if list(Path(folder).glob(f"torch-{TORCH_VERSION}+cpu-*.whl")):
            return ["--no-index", "--find-links", folder]
    return ["--extra-index-url", TORCH_CPU_INDEX]


def ensure_wheels() -> None:
    """Download torch and every dependency of kubeddp as wheels for bookworm's Python."""
    if sys.version_info[:2] != BASE_PYTHON:
        wanted = ".".join(map(str, BASE_PYTHON))
        raise DockerSetupError(
            f"the host Python is {sys.version.split()[0]} but the base image has {wanted}: "
            f"run the tests with a Python {wanted} venv so the downloaded wheels fit the image"
        )
    wheel_dir().mkdir(parents=True, exist_ok=True)
    # pip download resolves against PyPI every time (tens of seconds): skip it while the
    # locked packages are the ones the cached wheels were downloaded for.
    digest = hashlib.sha256(LOCK.read_bytes() + TORCH_VERSION.encode())
    stamp = wheel_dir() / ".pyproject-sha256"
    if stamp.exists() and stamp.read_text() == digest.hexdigest():
        return
    # What the Dockerfile installs: the hash-locked packages, and torch (the CPU wheel).
    download = [sys.executable, "-m", "pip", "download", "--quiet", "--dest", wheel_dir()]
    download += ["--only-binary=:all:", "--no-deps"]
    sh(*download, "--require-hashes", "-r", LOCK, timeout=1200)
    sh(*download, *_torch_cpu_source(), f"torch=={TORCH_VERSION}+cpu", timeout=1200)
    if not list(wheel_dir().glob(f"torch-{TORCH_VERSION}*.whl")):
        raise DockerSetupError(f"no torch {TORCH_VERSION} wheel in {wheel_dir()}")
    stamp.write_text(digest.hexdigest())


def _context_files() -> list[str]:
    """Files of the checkout: tracked plus untracked ones git does not ignore."""
    proc = sh(
        "git",
        "-C",
        REPO,
        "ls-files",
        "-z",
        "--cached",
        "--others",
        "--exclude-standard",
        check=False,
    )
    if proc.returncode == 0:
        return [f for f in proc.stdout.split("\0") if f and not f.startswith(".venv/")]
    skip = {".git", ".venv", "wheels"}
    return [
        str(p.relative_to(REPO))
        for p in REPO.rglob("*")
        if p.is_file() and p.relative_to(REPO).parts[0] not in skip
    ]


def make_context(dest: Path) -> None:
    """A build context: the checkout's files plus the cached wheels in wheels/ (hard links)."""
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    for rel in _context_files():
        src = REPO / rel
        if not src.is_file():  # deleted in the work tree but still in the index
            continue
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, target)
    wheels = dest / "wheels"
    wheels.mkdir(exist_ok=True)
    keep = wheels / ".gitkeep"
    if not keep.exists():
        keep.touch()
        os.utime(keep, (0, 0))  # a fixed mtime keeps the COPY layer cached between builds
    for wheel in wheel_dir().glob("*.whl"):
        try:
            os.link(wheel, wheels / wheel.name)
        except OSError:  # another file system
            shutil.copy2(wheel, wheels / wheel.name)


def build_image(tag: str = IMAGE) -> None:
    """Build the CPU image offline with the legacy builder (what CI and old daemons have)."""
    context = CACHE_DIR / f"context-{os.getpid()}"
    make_context(context)
    env = {**os.environ, "DOCKER_BUILDKIT": "0"}
    log_path = CACHE_DIR / "build.log"
    try:
        build_args = {
            "BASE_IMAGE": BASE_IMAGE,
            "VARIANT": "cpu",
            "PIP_OFFLINE": "1",
            "TORCH_VERSION": TORCH_VERSION,
        }
        flags = [f for key, value in build_args.items() for f in ("--build-arg", f"{key}={value}")]
        proc = sh(
            "docker",
            "build",
            "--force-rm",
            "--network",
            "none",
            "--tag",
            tag,
            *flags,
            context,
            timeout=1500,
            env=env,
            check=False,
        )
        log_path.write_text(proc.stdout + proc.stderr)
        if proc.returncode != 0:
            tail = (proc.stdout + proc.stderr)[-4000:]
            raise DockerSetupError(f"docker build of {tag} failed (log {log_path}):\n{tail}")
    finally:
        shutil.rmtree(context, ignore_errors=True)


def remove_leftovers() -> None:
    """Remove containers and networks that a killed earlier run left behind."""
    label = f"label={TEST_LABEL}"
    ids = sh("docker", "ps", "-aq", "--filter", label, check=False).stdout.split()
    if ids:
        sh("docker", "rm", "-f", *ids, check=False, timeout=120)
    nets = sh("docker", "network", "ls", "-q", "--filter", label, check=False).stdout.split()
    if nets:
        sh("docker", "network", "rm", *nets, check=False, timeout=60)


_subnet_counter = itertools.count()


@dataclass
class DockerRun:
    """Containers and networks of one test, all labelled, all removed by `cleanup`."""

    image: str
    prefix: str
    containers: list[str] = field(default_factory=list)
    networks: list[str] = field(default_factory=list)

    def network(self) -> str:
        """A new `--internal` network: containers reach each other by name, nothing else."""
        name = f"{self.prefix}-net{len(self.networks)}"
        # Four /26 blocks of TEST_SUBNET, in turn, so a network left by a failed removal does
        # not block the next test's.
        block = next(_subnet_counter) % 4 * 64
        sh(
            "docker",
            "network",
            "create",
            "--internal",
            "--label",
            TEST_LABEL,
            "--subnet",
            f"{TEST_SUBNET.rsplit('.', 1)[0]}.{block}/26",
            name,
        )
        self.networks.append(name)
        return name

    def start(
        self,
        name: str,
        args: list[str] | tuple[str, ...] = (),
        *,
        network: str = "",
        env: dict[str, str] | None = None,
        options: list[str] | tuple[str, ...] = (),
    ) -> str:
        """`docker run -d` of the image; `options` go before the image, `args` after it."""
        cmd = ["docker", "run", "-d", "--name", name, "--label", TEST_LABEL]
        if network:
            cmd += ["--network", network, "--hostname", name]
        for key, value in (env or {}).items():
            cmd += ["--env", f"{key}={value}"]
        self.containers.append(name)
        sh(*cmd, *options, self.image, *args, timeout=120)
        return name

    def wait(self, name: str, timeout: float) -> int:
        """The container's exit code; DockerSetupError with its log when it outlives timeout."""
        try:
            proc = sh("docker", "wait", name, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise DockerSetupError(
                f"container {name} still running after {timeout:.0f}s; its log:\n"
                + self.logs(name)[-4000:]
            ) from None
        return int(proc.stdout.strip())

    def logs(self, name: str) -> str:
        proc = sh("docker", "logs", name, timeout=60, check=False)
        return proc.stdout + proc.stderr

    def wait_for_log(self, name: str, needle: str, timeout: float) -> str:
        """Poll the log until it contains `needle`; fail with the log if it never does."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.logs(name)
            if needle in text:
                return text
            state = sh("docker", "inspect", "-f", "{{.State.Running}}", name, check=False)
            if state.stdout.strip() == "false":
                break
            time.sleep(1)
        raise DockerSetupError(f"{needle!r} not in the log of {name}:\n{self.logs(name)[-4000:]}")

    def dump_logs(self) -> None:
        for name in self.containers:
            print(f"----- docker logs {name}\n{self.logs(name)[-6000:]}")

    def cleanup(self) -> None:
        if self.containers:
            sh("docker", "rm", "-f", "-v", *self.containers, timeout=120, check=False)
        for net in self.networks:
            sh("docker", "network", "rm", net, timeout=60, check=False)


def prepare(times: StepTimes | None = None) -> str:
    """Everything, in order; returns the tag of the CPU image."""
    times = times or StepTimes()
    times.run("apt packages", ensure_packages)
    times.run("dockerd", ensure_dockerd)
    times.run("leftovers", remove_leftovers)
    times.run("base image", ensure_base_image)
    times.run("wheels", ensure_wheels)
    times.run("image build", build_image)
    return IMAGE


if __name__ == "__main__":
    step_times = StepTimes()
    print(prepare(step_times))
    print(step_times.summary(), file=sys.stderr)


@dataclass
class TrainingLog:
    """What rank 0 printed: world size, backend, the loss at each logged step, the end line."""

    world_size: int
    backend: str
    losses: list[float]
    final_loss: float | None
    start_loss: float | None
    text: str

    @classmethod
    def parse(cls, text: str) -> TrainingLog:
        world = re.search(r"\| world size (\d+) \((\w+)", text)
        done = re.search(r"^done: .*final loss ([-\d.naif]+) \(start ([-\d.naif]+)\)", text, re.M)
        return cls(
            world_size=int(world.group(1)) if world else 0,
            backend=world.group(2) if world else "",
            losses=[
                float(m)
                for m in re.findall(r"^step \d+/\d+ \| epoch \d+ \| loss ([-\d.]+)", text, re.M)
            ],  # fmt: skip
            final_loss=float(done.group(1)) if done else None,
            start_loss=float(done.group(2)) if done else None,
            text=text,
        )

    def assert_trained(self, world_size: int) -> None:
        """Finished with `world_size` ranks and a final loss below the starting one."""
        tail = self.text[-4000:]
        assert self.world_size == world_size, f"world size {self.world_size}:\n{tail}"
        assert self.backend == "gloo", f"backend {self.backend!r}:\n{tail}"
        assert self.final_loss is not None and self.start_loss is not None, f"no done line:\n{tail}"
        assert self.final_loss < self.start_loss, f"loss did not decrease:\n{tail}"
