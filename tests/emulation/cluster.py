"""A one-machine stand-in for a cluster: each pod is a process tree in its own network namespace.

Network: one namespace holds a bridge (the "pod network", 198.51.100.0/24, never on the host's
own interfaces); every pod gets a fresh namespace with a veth on that bridge, its own UTS
namespace with hostname = the pod's hostname, and /etc/netns/<ns>/hosts naming every pod and
Service of the job, as cluster DNS would. A recreated pod gets a new namespace and address and
every hosts file is rewritten in place (the bind mounts `ip netns exec` made keep seeing it).

Deviations from a real cluster, each on purpose:
- processes run on the host's filesystem as root, not in the image: volume mount paths
  (/etc/kubeddp, /checkpoints, /tmp) are mapped to per-job directories and every argument or
  ConfigMap value naming such a path is rewritten to the host directory;
- the image ENTRYPOINT (`tini -- kubeddp launch`) is `kubeddp launch` from this venv;
- no resource limits, probes, securityContext or image pulls.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from operator_env import (
    IMAGE_ENTRYPOINT,
    JobPlan,
    PodPlan,
    container_env,
    expand,
)

POD_NETWORK = ipaddress.ip_network("198.51.100.0/24")
NAMESPACE = "default"
CLUSTER_DOMAIN = "svc.cluster.local"
VENV_BIN = Path(sys.executable).parent
POLL_SECONDS = 0.2
# The kubelet points every pod at the API server's Service; kubeddp uses it to detect a pod.
KUBELET_ENV = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}


class EmulationError(AssertionError):
    """The emulated job did not behave; the message carries the pods' log tails."""


def _ip(*args: str) -> str:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise EmulationError(f"ip {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout


def netns_pids(ns: str) -> list[int]:
    done = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, timeout=30)
    return [int(p) for p in done.stdout.split()] if done.returncode == 0 else []


def kill_netns_processes(ns: str, deadline_seconds: float = 10.0) -> None:
    """SIGKILL everything in the namespace until nothing is left (workers may still fork)."""
    end = time.monotonic() + deadline_seconds
    while pids := netns_pids(ns):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if time.monotonic() > end:
            raise EmulationError(f"processes {pids} in netns {ns} survive SIGKILL")
        time.sleep(0.05)


@dataclass
class PodRun:
    """One incarnation of a pod: namespace, address, process, log."""

    plan: PodPlan
    attempt: int
    ns: str
    ip: str
    log_path: Path
    popen: subprocess.Popen[bytes] | None = None
    exit_code: int | None = None

    def output(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def tail(self, lines: int = 40) -> str:
        text = self.output().splitlines()[-lines:]
        return f"--- {self.plan.name} (attempt {self.attempt}, {self.ip}) ---\n" + "\n".join(text)


@dataclass
class JobStatus:
    phase: str = "Running"  # Running | Succeeded | Failed
    reason: str = ""
    restarts: dict[str, int] = field(default_factory=dict)


class EmulatedCluster:
    """Runs one JobPlan at a time; `close()` removes every process, namespace and file."""

    def __init__(self, workdir: Path | None = None) -> None:
        self.run_id = uuid.uuid4().hex[:6]
        self._owns_workdir = workdir is None  # a caller's directory keeps the logs
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix=f"kubeddp-emu-{self.run_id}-"))
        self.bridge_ns = f"kemu{self.run_id}br"
        self._namespaces: list[str] = []
        self._next_host = 10
        self._veths = 0
        self.plan: JobPlan | None = None
        self.pods: dict[str, PodRun] = {}
        self.history: list[PodRun] = []
        self.status = JobStatus()
        self.volumes: dict[str, Path] = {}
        self._make_bridge()

    # ------------------------------------------------------------ network
    def _make_bridge(self) -> None:
        _ip("netns", "add", self.bridge_ns)
        self._namespaces.append(self.bridge_ns)
        _ip("-n", self.bridge_ns, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.bridge_ns, "link", "set", "br0", "up")
        _ip("-n", self.bridge_ns, "link", "set", "lo", "up")
        # The bridge namespace also gets an address so a test can reach pods (metrics).
        _ip("-n", self.bridge_ns, "addr", "add", f"{POD_NETWORK[1]}/24", "dev", "br0")

    def _new_pod_namespace(self) -> tuple[str, str]:
        ns = f"kemu{self.run_id}p{self._veths}"
        address = str(POD_NETWORK[self._next_host])
        self._next_host += 1
        veth = f"ke{self.run_id}v{self._veths}"
        self._veths += 1
        _ip("netns", "add", ns)
        self._namespaces.append(ns)
        etc = Path("/etc/netns") / ns
        etc.mkdir(parents=True, exist_ok=True)
        (etc / "hosts").write_text("")
        # No nameserver answers inside the namespace: unknown names fail at once, as NXDOMAIN
        # would, instead of waiting for the host's resolver.
        (etc / "resolv.conf").write_text("nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")
        _ip("-n", self.bridge_ns, "link", "add", veth, "type", "veth", "peer", "name", "eth0",
            "netns", ns)  # fmt: skip
        _ip("-n", self.bridge_ns, "link", "set", veth, "master", "br0", "up")
        _ip("-n", ns, "addr", "add", f"{address}/24", "dev", "eth0")
        _ip("-n", ns, "link", "set", "eth0", "up")
        _ip("-n", ns, "link", "set", "lo", "up")
        return ns, address

    def _drop_namespace(self, ns: str) -> None:
        kill_netns_processes(ns)
        with contextlib.suppress(EmulationError):
            _ip("netns", "del", ns)
        shutil.rmtree(Path("/etc/netns") / ns, ignore_errors=True)
        if ns in self._namespaces:
            self._namespaces.remove(ns)

    def hosts_file(self) -> str:
        lines = ["127.0.0.1 localhost"]
        for run in self.pods.values():
            names = []
            for name in run.plan.dns_names:
                names.append(name)
                if "." in name or name == run.plan.service:
                    names.append(f"{name}.{NAMESPACE}.{CLUSTER_DOMAIN}")
            lines.append(f"{run.ip} {' '.join(dict.fromkeys(names))}")
        return "\n".join(lines) + "\n"

    def _write_hosts(self) -> None:
        text = self.hosts_file()
        for run in self.pods.values():
            path = Path("/etc/netns") / run.ns / "hosts"
            # in place: the running pod's /etc/hosts is a bind mount of this very inode
            with open(path, "r+" if path.exists() else "w") as f:
                f.seek(0)
                f.write(text)
                f.truncate()

    # ------------------------------------------------------------ volumes
    def _volume_dir(self, plan: PodPlan, volume: dict[str, Any]) -> Path:
        job = self.plan
        assert job is not None
        if "configMap" in volume:
            cm_name = volume["configMap"]["name"]
            if cm_name not in job.configmaps:
                raise EmulationError(
                    f"volume {volume['name']}: ConfigMap {cm_name} not in manifest"
                )
            # per pod: the paths rewritten inside it differ from pod to pod
            key = f"cm-{plan.name}-{cm_name}"
        elif "persistentVolumeClaim" in volume:
            key = f"pvc-{volume['persistentVolumeClaim']['claimName']}"  # shared by all pods
        elif "emptyDir" in volume:
            key = f"emptydir-{plan.name}-{volume['name']}"  # lives as long as the pod
        else:
            raise EmulationError(f"volume {volume['name']}: type not emulated")
        if key not in self.volumes:
            path = self.workdir / "volumes" / key
            path.mkdir(parents=True, exist_ok=True)
            path.chmod(0o777)
            self.volumes[key] = path
        return self.volumes[key]

    def _mounts(self, plan: PodPlan) -> dict[str, Path]:
        by_name = {v["name"]: v for v in plan.volumes}
        mounts: dict[str, Path] = {}
        for mount in plan.container.get("volumeMounts", []):
            if mount["mountPath"] == "/dev/shm":
                continue  # the host's /dev/shm serves
            mounts[mount["mountPath"].rstrip("/")] = self._volume_dir(plan, by_name[mount["name"]])
        return mounts

    @staticmethod
    def rewrite_path(text: str, mounts: dict[str, Path]) -> str:
        """Map an in-pod path (alone, or after `key=`) to its host directory."""
        prefix, sep, value = text.rpartition("=") if "=" in text else ("", "", text)
        for mount_path in sorted(mounts, key=len, reverse=True):
            if value == mount_path or value.startswith(mount_path + "/"):
                return f"{prefix}{sep}{mounts[mount_path]}{value[len(mount_path) :]}"
        return text

    def _fill_configmaps(self, plan: PodPlan, mounts: dict[str, Path]) -> None:
        assert self.plan is not None
        for name, data in self.plan.configmaps.items():
            path = self.volumes.get(f"cm-{plan.name}-{name}")
            if path is None:
                continue
            for key, content in data.items():
                (path / key).write_text(self._rewrite_yaml(content, mounts))

    def _rewrite_yaml(self, content: str, mounts: dict[str, Path]) -> str:
        try:
            doc = yaml.safe_load(content)
        except yaml.YAMLError:
            return content

        def walk(node: Any) -> Any:
            if isinstance(node, dict):
                return {k: walk(v) for k, v in node.items()}
            if isinstance(node, list):
                return [walk(v) for v in node]
            if isinstance(node, str):
                return self.rewrite_path(node, mounts)
            return node

        return yaml.safe_dump(walk(doc), sort_keys=False)

    # ------------------------------------------------------------ pods
    def _argv(self, plan: PodPlan, env: dict[str, str], mounts: dict[str, Path]) -> list[str]:
        container = plan.container
        command = container.get("command")
        args = container.get("args", [])
        argv = [*(command if command else IMAGE_ENTRYPOINT), *args]
        argv = [self.rewrite_path(expand(str(a), env), mounts) for a in argv]
        if argv[:2] == ["tini", "--"]:  # the image's PID 1; the host has no tini
            argv = argv[2:]
        if argv[0] == "kubeddp":
            argv[0] = str(VENV_BIN / "kubeddp")
        return argv

    def _start_pod(self, plan: PodPlan, attempt: int) -> PodRun:
        ns, address = self._new_pod_namespace()
        log_dir = self.workdir / "logs"
        log_dir.mkdir(parents=True, exist_ok=True)
        run = PodRun(plan, attempt, ns, address, log_dir / f"{plan.name}.{attempt}.log")
        self.pods[plan.name] = run
        self.history.append(run)
        self._write_hosts()
        mounts = self._mounts(plan)
        self._fill_configmaps(plan, mounts)
        env = {
            "PATH": f"{VENV_BIN}:/usr/local/bin:/usr/bin:/bin",
            "HOSTNAME": plan.hostname,
            **KUBELET_ENV,
            **container_env(plan, NAMESPACE, address),
        }
        if "/tmp" in mounts:
            env["TMPDIR"] = str(mounts["/tmp"])
            env.setdefault("HOME", str(mounts["/tmp"]))
        argv = self._argv(plan, env, mounts)
        # netns for the network, a UTS namespace so `hostname` is the pod's, as in a pod.
        wrapped = [
            "ip", "netns", "exec", ns, "unshare", "--uts", "--",
            "sh", "-c", 'hostname "$0" && exec "$@"', plan.hostname, *argv,
        ]  # fmt: skip
        with open(run.log_path, "ab") as log:
            run.popen = subprocess.Popen(
                wrapped,
                env=env,
                cwd=str(mounts.get("/tmp", self.workdir)),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return run

    def start(self, plan: JobPlan) -> None:
        if self.plan is not None:
            raise EmulationError("one job per EmulatedCluster")
        self.plan = plan
        for pod in plan.pods:
            self.status.restarts[pod.name] = 0
            self._start_pod(pod, 0)

    def kill_pod(self, name: str, sig: int = signal.SIGKILL) -> None:
        """A node loss (SIGKILL) or a deletion's first step (SIGTERM) of every process."""
        run = self.pods[name]
        for pid in netns_pids(run.ns):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    # ------------------------------------------------------------ the controller's loop
    def _decide(self, run: PodRun) -> str:
        """succeeded | restart | fail, by the owning controller's rules."""
        assert self.plan is not None
        code = run.exit_code
        if code == 0:
            return "succeeded"
        policy = self.plan.restart_policy.get(run.plan.replica_type, "Never")
        if code in self.plan.fail_job_exit_codes:
            return "fail"
        retryable = {
            "Never": False,
            "OnFailure": True,
            "Always": True,
            "ExitCode": code is not None and code >= 128,  # 1-127 are permanent errors
        }.get(policy, False)
        if self.plan.kind == "IndexedJob":
            retryable = True  # a failed index is retried until backoffLimit
        total_restarts = sum(self.status.restarts.values())
        if not retryable or total_restarts >= self.plan.backoff_limit:
            return "fail"
        return "restart"

    def _job_succeeded(self, done: set[str]) -> bool:
        assert self.plan is not None
        plan = self.plan
        if plan.kind == "PyTorchJob":
            masters = [p.name for p in plan.pods if p.replica_type == "Master"]
            if masters:
                return all(m in done for m in masters)  # the Master decides
            workers = [p.name for p in plan.pods if p.replica_type == "Worker"]
            return all(w in done for w in workers) or (plan.elastic and bool(done))
        return all(p.name in done for p in plan.pods)  # Indexed Job / JobSet: every pod

    def tick(self) -> JobStatus:
        assert self.plan is not None
        if self.status.phase != "Running":
            return self.status
        succeeded: set[str] = {r.plan.name for r in self.pods.values() if r.exit_code == 0}
        for name, run in list(self.pods.items()):
            if run.exit_code is not None or run.popen is None:
                continue
            code = run.popen.poll()
            if code is None:
                continue
            run.exit_code = 128 - code if code < 0 else code
            decision = self._decide(run)
            if decision == "succeeded":
                succeeded.add(name)
            elif decision == "fail":
                self.status.phase = "Failed"
                self.status.reason = f"pod {name} exited {run.exit_code}"
                return self.status
            else:
                self.status.restarts[name] += 1
                self._drop_namespace(run.ns)
                self._start_pod(run.plan, run.attempt + 1)
        if self._job_succeeded(succeeded):
            self.status.phase = "Succeeded"
        return self.status

    def run_until(self, predicate: Callable[[], object], timeout: float, what: str) -> object:
        end = time.monotonic() + timeout
        while True:
            self.tick()
            value = predicate()
            if value:
                return value
            if self.status.phase != "Running":
                raise EmulationError(f"job {self.status.phase} ({self.status.reason}) before "
                                     f"{what}\n{self.log_tails()}")  # fmt: skip
            if time.monotonic() > end:
                raise EmulationError(f"timed out after {timeout:.0f}s waiting for {what}\n"
                                     f"{self.log_tails()}")  # fmt: skip
            time.sleep(POLL_SECONDS)

    def wait_finished(self, timeout: float) -> JobStatus:
        end = time.monotonic() + timeout
        while self.tick().phase == "Running":
            if time.monotonic() > end:
                raise EmulationError(f"job still running after {timeout:.0f}s\n{self.log_tails()}")
            time.sleep(POLL_SECONDS)
        return self.status

    # ------------------------------------------------------------ inspection
    def logs(self, name: str) -> str:
        """Every incarnation's output of pod `name`, oldest first (`kubectl logs --previous`...)."""
        return "".join(r.output() for r in self.history if r.plan.name == name)

    def all_logs(self) -> str:
        return "".join(r.output() for r in self.history)

    def log_tails(self) -> str:
        return "\n".join(r.tail() for r in self.history)

    def search_logs(self, pattern: str) -> re.Match[str] | None:
        return re.search(pattern, self.all_logs(), re.MULTILINE)

    def volume(self, key_prefix: str) -> Path:
        matches = [p for k, p in self.volumes.items() if k.startswith(key_prefix)]
        if len(matches) != 1:
            raise EmulationError(f"volume {key_prefix!r}: found {sorted(self.volumes)}")
        return matches[0]

    # ------------------------------------------------------------ cleanup
    def close(self) -> None:
        for run in self.pods.values():
            if run.popen is not None and run.popen.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(run.popen.pid, signal.SIGKILL)
        errors = []
        for ns in list(reversed(self._namespaces)):
            try:
                self._drop_namespace(ns)
            except EmulationError as exc:
                errors.append(str(exc))
        for run in self.pods.values():
            if run.popen is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    run.popen.wait(5)
        if self._owns_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
        if errors:
            raise EmulationError("; ".join(errors))
