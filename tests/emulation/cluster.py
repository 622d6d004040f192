"""A one-machine stand-in for a cluster: each pod is a process tree in its own network namespace.

Network: one namespace holds a bridge (the "pod network", 198.51.100.0/24, never on the host's
own interfaces); every pod gets a fresh namespace with a veth on that bridge, its own UTS
namespace with hostname = the pod's hostname, and /etc/netns/<ns>/hosts naming every pod and
Service of the job, as cluster DNS would. A recreated pod gets a new namespace, address and
emptyDirs, and every hosts file is rewritten in place (the bind mounts `ip netns exec` made
keep seeing it). A container restarted in place (restartPolicy OnFailure) keeps all of them.

The controllers' decisions (recreate, restart in place, count, fail) are controllers.py's; the
operators' pods and env are operator_env.py's. Pod Security admission (`restricted`) and the
training-operator's init-pytorch container are modelled: a rejected pod is never created, an
init container runs (and must succeed) before the main container.

Deviations from a real cluster, each on purpose:
- processes run on the host's filesystem as root, not in the image: volume mount paths
  (/etc/kubeddp, /checkpoints, /tmp, /dev/shm) are mapped to per-job directories and every
  argument, env or ConfigMap value naming such a path is rewritten to the host directory (the
  workers' own shared memory still uses the host's /dev/shm);
- the image ENTRYPOINT (`tini -- kubeddp launch`) is `kubeddp launch` from this venv;
- init-pytorch's `nslookup` loop runs as the same loop over `getent hosts` (names resolve
  through the hosts file here); other init containers are not emulated;
- the kubelet's restart back-off is a fixed delay (no doubling); no resource limits, probes,
  securityContext enforcement inside the pod, or image pulls;
- every pod incarnation is scheduled onto a node of its own (a recreated pod lands elsewhere,
  as after a node loss); storage.py decides whether its claims let it start there (a pod that
  cannot stays Pending and is tried again at every tick); the default StorageClass offers every
  access mode unless a test gives the cluster other classes.
- the container's terminationMessagePath is a file per pod incarnation, named to the
  container by KUBEDDP_TERMINATION_LOG (the kubelet mounts it at /dev/termination-log);
- nodes are spread over three zones; a pod using a zonal disk is placed in the disk's zone
  (storage.py). `lose_nodes` models a node loss: its pods' processes are SIGKILLed; a
  Deployment's pod is evicted after the node.kubernetes.io/unreachable toleration (300 s,
  DefaultTolerationSeconds) and replaced, and its volumes are force-detached 6 min after that;
  `node_loss_scale` shrinks both for tests;
- the Job controller's pod-recreation back-off (10 s doubling, 6 min cap) is real by default;
  `job_backoff_scale` shrinks it for tests that only need its order of events;
- with `trainjob_status` (Trainer's TrainJobStatus gate) the controller's status server is
  tests/helpers/trainer_status_server.py, in this process, listening on the bridge namespace's
  address under the controller Service's DNS name; the kubelet's projected token is a JWT of
  the test's issuer (not rotated), and an env value naming a mount path is rewritten too.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml
from controllers import (
    FAIL,
    RECREATE,
    RESTART_IN_PLACE,
    RESTART_JOBSET,
    SUCCEEDED,
    Counters,
    Ended,
    decide,
    job_failure_reason,
    job_recreation_delay,
    job_succeeded,
    jobset_on_job_failure,
    past_deadline,
    restricted_violations,
)
from operator_env import (
    IMAGE_ENTRYPOINT,
    INIT_CONTAINER_IMAGE,
    INIT_CONTAINER_NAME,
    JobPlan,
    PodPlan,
    container_env,
    expand,
    status_url,
    with_trainjob_status,
)
from storage import RWX_NFS, Storage, StorageClass, claim_names

from tests.helpers import trainer_status_server

POD_NETWORK = ipaddress.ip_network("198.51.100.0/24")
NAMESPACE = "default"
CLUSTER_DOMAIN = "svc.cluster.local"
VENV_BIN = Path(sys.executable).parent
# What the image holds (this checkout and its venv): never a pod's own mount, even where the
# checkout sits under a path a pod maps (a clone in /tmp)
IMAGE_PATHS = (str(Path(__file__).resolve().parents[2]), sys.prefix)
POLL_SECONDS = 0.2
# The kubelet points every pod at the API server's Service; kubeddp uses it to detect a pod.
KUBELET_ENV = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
# The kubelet's first restart back-off (CrashLoopBackOff starts at 10 s).
RESTART_DELAY_SECONDS = 10.0
ZONES = ("zone-a", "zone-b", "zone-c")
EVICTION_SECONDS = 300.0  # DefaultTolerationSeconds: node.kubernetes.io/unreachable
FORCE_DETACH_SECONDS = 360.0  # attach/detach controller: ReconcilerMaxWaitForUnmountDuration
DISRUPTION_TARGET = "DisruptionTarget"
ENV_TERMINATION_LOG = "KUBEDDP_TERMINATION_LOG"
# kubelet: FallbackToLogsOnError takes the last 80 lines or 2048 bytes of the log, the smaller
FALLBACK_LINES = 80
FALLBACK_BYTES = 2048


class EmulationError(AssertionError):
    """The emulated job did not behave; the message carries the pods' log tails."""


def _ip(*args: str) -> str:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise EmulationError(f"ip {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout


def listen_in_namespace(ns: str, address: str, port: int) -> socket.socket:
    """A TCP socket listening on address:port inside network namespace `ns`, for a server of
    this process: a child started in the namespace binds it and hands it over (SCM_RIGHTS)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    code = (
        "import socket, sys\n"
        "s = socket.socket()\n"
        "s.bind((sys.argv[1], int(sys.argv[2])))\n"
        "s.listen(64)\n"
        "socket.send_fds(socket.socket(fileno=int(sys.argv[3])), [b'fd'], [s.fileno()])\n"
    )
    argv = [sys.executable, "-c", code, address, str(port), str(theirs.fileno())]
    with theirs:
        done = subprocess.run(["ip", "netns", "exec", ns, *argv], pass_fds=(theirs.fileno(),),
                              capture_output=True, text=True, timeout=30)  # fmt: skip
    with ours:
        if done.returncode != 0:
            raise EmulationError(f"cannot listen on {address}:{port} in {ns}: {done.stderr}")
        _, fds, _, _ = socket.recv_fds(ours, 16, 1)
    return socket.socket(fileno=fds[0])


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
    """One incarnation of a pod (a pod object): namespace, address, processes, log.

    `restarts` counts the kubelet's in-place restarts of its main container (restartCount).
    """

    plan: PodPlan
    attempt: int  # incarnations of this pod name before this one
    ns: str
    ip: str
    log_path: Path
    uid: str = field(default_factory=lambda: uuid.uuid4().hex[:6])
    popen: subprocess.Popen[bytes] | None = None  # the main container's process
    init_popen: subprocess.Popen[bytes] | None = None  # the init container running now
    init_left: list[dict[str, Any]] = field(default_factory=list)
    init_exit_codes: list[int] = field(default_factory=list)
    exit_code: int | None = None
    restarts: int = 0
    start_at: float = 0.0  # a restart in place waits for the back-off
    conditions: set[str] = field(default_factory=set)
    kill_at: float | None = None  # end of the termination grace period
    done: bool = False  # the pod is finished (succeeded, or failed and replaced)
    node: str = ""  # the node it is scheduled on
    zone: str = ""  # that node's zone
    evict_at: float | None = None  # its node is lost: when the node controller evicts it
    pending: str = ""  # why it has not started (its volumes), "" once it runs
    gone: bool = False  # deleted: no DNS record any more
    ended_at: float | None = None  # time.monotonic() when its container ended
    message: str = ""  # the termination message of its container's last end

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
    restarts: dict[str, int] = field(default_factory=dict)  # per pod name: recreated + in place
    counters: Counters = field(default_factory=Counters)
    events: list[str] = field(default_factory=list)


class EmulatedCluster:
    """Runs one JobPlan at a time; `close()` removes every process, namespace and file."""

    def __init__(
        self,
        workdir: Path | None = None,
        pod_security: str | None = None,
        restart_delay_seconds: float = RESTART_DELAY_SECONDS,
        image_files: dict[str, Path] | None = None,
        storage_classes: list[StorageClass] | None = None,
        job_backoff_scale: float = 1.0,
        trainjob_status: bool = False,
        node_loss_scale: float = 1.0,
    ) -> None:
        self.pod_security = pod_security  # the namespace's enforced level: None | restricted
        # Paths the image holds (what its Dockerfile COPYs, e.g. /app/train.py) -> the host file
        # that stands for each; a volume mounted over one shadows it, as in a real pod.
        self.image_files = dict(image_files or {})
        self.restart_delay_seconds = restart_delay_seconds
        self.job_backoff_scale = job_backoff_scale
        self.node_loss_scale = node_loss_scale
        # pod name -> (time.monotonic() to create it, its plan, attempt): the Job controller's
        # recreation back-off
        self.pending: dict[str, tuple[float, PodPlan, int]] = {}
        self.created_at: dict[str, list[float]] = {}  # pod name -> when each incarnation began
        self.rejected: dict[str, list[str]] = {}  # pod name -> Pod Security violations
        self.run_id = uuid.uuid4().hex[:6]
        self._owns_workdir = workdir is None  # a caller's directory keeps the logs
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix=f"kubeddp-emu-{self.run_id}-"))
        self.bridge_ns = f"kemu{self.run_id}br"
        self._namespaces: list[str] = []
        self._next_host = 10
        self._veths = 0
        self.plan: JobPlan | None = None
        self.started_at = 0.0
        self.pods: dict[str, PodRun] = {}
        self.history: list[PodRun] = []
        self.status = JobStatus()
        self.volumes: dict[str, Path] = {}
        self.storage = Storage(storage_classes if storage_classes is not None else [RWX_NFS])
        self._nodes = 0
        # Trainer's TrainJobStatus gate: its status server, once a TrainJob starts
        self.trainjob_status = trainjob_status
        self.status_server: trainer_status_server.TrainerStatusServer | None = None
        self.services: dict[str, list[str]] = {}  # address -> Service DNS names (not pods)
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
            if run.gone:
                continue
            names = []
            for name in run.plan.dns_names:
                names.append(name)
                if "." in name or name == run.plan.service:
                    names.append(f"{name}.{NAMESPACE}.{CLUSTER_DOMAIN}")
            lines.append(f"{run.ip} {' '.join(dict.fromkeys(names))}")
        lines += [f"{address} {' '.join(names)}" for address, names in self.services.items()]
        return "\n".join(lines) + "\n"

    def _write_hosts(self) -> None:
        text = self.hosts_file()
        for run in self.pods.values():
            if run.gone:
                continue
            path = Path("/etc/netns") / run.ns / "hosts"
            # in place: the running pod's /etc/hosts is a bind mount of this very inode
            with open(path, "r+" if path.exists() else "w") as f:
                f.seek(0)
                f.write(text)
                f.truncate()

    # ------------------------------------------------------------ volumes
    def _volume_dir(self, run: PodRun, volume: dict[str, Any]) -> Path:
        plan = run.plan
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
            key = f"emptydir-{plan.name}-{volume['name']}-{run.uid}"  # lives as long as the pod
        elif "projected" in volume:
            key = f"projected-{plan.name}-{volume['name']}-{run.uid}"  # the kubelet's, per pod
        elif "secret" in volume:
            key = f"secret-{plan.name}-{volume['name']}-{run.uid}"  # the kubelet's, per pod
        else:
            raise EmulationError(f"volume {volume['name']}: type not emulated")
        if key not in self.volumes:
            path = self.workdir / "volumes" / key
            path.mkdir(parents=True, exist_ok=True)
            path.chmod(0o777)
            self.volumes[key] = path
            if "projected" in volume:
                self._project(plan, volume["projected"], path)
            if "secret" in volume:
                self._write_secret(volume["secret"], path)
        return self.volumes[key]

    def _write_secret(self, source: dict[str, Any], path: Path) -> None:
        """The kubelet's secret volume: the listed keys (else all) as files, mode 0644."""
        assert self.plan is not None
        name = source["secretName"]
        if name not in self.plan.secrets:
            raise EmulationError(f"Secret {name} not in manifest")
        data = self.plan.secrets[name]
        items = source.get("items") or [{"key": k, "path": k} for k in data]
        for item in items:
            (path / item["path"]).write_bytes(data[item["key"]])
            (path / item["path"]).chmod(source.get("defaultMode", 0o644))

    def _project(self, plan: PodPlan, projected: dict[str, Any], path: Path) -> None:
        """The kubelet's projected volume: a service-account token bound to the pod (from the
        emulated API server's issuer) and ConfigMap keys."""
        assert self.plan is not None
        for source in projected["sources"]:
            if "serviceAccountToken" in source and self.status_server is not None:
                token = source["serviceAccountToken"]
                seconds = token.get("expirationSeconds", 3600)
                issued = self.status_server.credentials.issue(
                    token["audience"], NAMESPACE, seconds, pod=plan.name
                )
                (path / token["path"]).write_text(issued)
            elif "configMap" in source:
                data = self.plan.configmaps[source["configMap"]["name"]]
                for item in source["configMap"]["items"]:
                    (path / item["path"]).write_text(data[item["key"]])
            else:
                raise EmulationError(f"projected source {sorted(source)} is not emulated")

    def _mounts(self, run: PodRun) -> dict[str, Path]:
        by_name = {v["name"]: v for v in run.plan.volumes}
        mounts: dict[str, Path] = dict(self.image_files)
        for mount in run.plan.container.get("volumeMounts", []):
            # /dev/shm too: the host's serves the workers' shared memory (shm_open), and a path
            # under it named in the env (the in-memory snapshots) is the pod's own emptyDir,
            # gone when the pod is recreated, kept when its container restarts in place
            mounts[mount["mountPath"].rstrip("/")] = self._volume_dir(run, by_name[mount["name"]])
        return mounts

    @staticmethod
    def rewrite_path(text: str, mounts: dict[str, Path]) -> str:
        """Map an in-pod path (alone, or after `key=`) to its host directory."""
        prefix, sep, value = text.rpartition("=") if "=" in text else ("", "", text)
        if any(value == p or value.startswith(p + "/") for p in IMAGE_PATHS):
            return text
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

    def _create_pod(self, plan: PodPlan, attempt: int) -> PodRun | None:
        """Admission, then a new pod object: its namespace, then its init containers or its
        main container. None when admission rejects it (the operator keeps trying, in vain)."""
        if self.pod_security == "restricted":
            violations = restricted_violations(plan)
            if violations:
                self.rejected[plan.name] = violations
                self.status.events.append(
                    f'FailedCreate: pods "{plan.name}" is forbidden: violates PodSecurity '
                    f'"restricted:latest": {"; ".join(violations)}'
                )
                return None
        ns, address = self._new_pod_namespace()
        log_dir = self.workdir / "logs"
        log_dir.mkdir(parents=True, exist_ok=True)
        run = PodRun(plan, attempt, ns, address, log_dir / f"{plan.name}.{attempt}.log")
        run.init_left = list(plan.init_containers)
        run.node = f"node-{self._nodes}"
        # the scheduler places a pod whose zonal disk exists in the disk's zone
        run.zone = self.storage.zone_of(claim_names(plan.volumes)) or ZONES[self._nodes % 3]
        self._nodes += 1
        self.pods[plan.name] = run
        self.history.append(run)
        self.created_at.setdefault(plan.name, []).append(time.monotonic())
        self._write_hosts()
        self._schedule(run)
        return run

    def _schedule(self, run: PodRun) -> None:
        """Start the pod if its claims let it run on its node, else leave it Pending."""
        claims = claim_names(run.plan.volumes)
        reason = self.storage.blocked(run.plan.name, run.node, claims, run.zone)
        if reason:
            if reason != run.pending:
                self.status.events.append(reason)
            run.pending = reason
            return
        run.pending = ""
        self.storage.attach(run.plan.name, run.node, claims, run.zone)
        self._next_step(run)

    def _next_step(self, run: PodRun) -> None:
        """Start the next init container, or the main container once they all succeeded."""
        if run.init_left:
            run.init_popen = self._spawn(run, self._init_argv(run.init_left.pop(0)), {})
        else:
            run.init_popen = None
            self._start_main(run)

    def _init_argv(self, container: dict[str, Any]) -> list[str]:
        if container.get("name") != INIT_CONTAINER_NAME or container.get("image") != (
            INIT_CONTAINER_IMAGE
        ):
            raise EmulationError(f"init container {container.get('name')!r} is not emulated")
        script = container["command"][-1]
        found = re.search(r"seq (\d+)\).*nslookup (\S+);", script)
        if not found:
            raise EmulationError(f"init-pytorch command not understood: {script!r}")
        tries, master = found.groups()
        # The same loop, resolving through the pod's hosts file instead of a DNS server.
        loop = (
            f"err=1;for i in $(seq {tries}); do if getent hosts {master} >/dev/null; then "
            "err=0 && break; fi;echo waiting for master; sleep 2; done; exit $err"
        )
        return ["sh", "-c", loop]

    def _start_main(self, run: PodRun) -> None:
        plan = run.plan
        mounts = self._mounts(run)
        self._fill_configmaps(plan, mounts)
        env = container_env(plan, NAMESPACE, run.ip)
        env = {name: self.rewrite_path(value, mounts) for name, value in env.items()}
        if "/tmp" in mounts:
            env["TMPDIR"] = str(mounts["/tmp"])
            env.setdefault("HOME", str(mounts["/tmp"]))
        termination_log = run.log_path.with_suffix(".termination-log")
        termination_log.write_text("")  # the kubelet's file, empty at every container start
        env[ENV_TERMINATION_LOG] = str(termination_log)
        run.exit_code = None
        run.popen = self._spawn(run, self._argv(plan, env, mounts), env, mounts)

    def _spawn(
        self,
        run: PodRun,
        argv: list[str],
        env: dict[str, str],
        mounts: dict[str, Path] | None = None,
    ) -> subprocess.Popen[bytes]:
        plan = run.plan
        full_env = {
            "PATH": f"{VENV_BIN}:/usr/local/bin:/usr/bin:/bin",
            "HOSTNAME": plan.hostname,
            **KUBELET_ENV,
            **env,
        }
        # netns for the network, a UTS namespace so `hostname` is the pod's, as in a pod.
        wrapped = [
            "ip", "netns", "exec", run.ns, "unshare", "--uts", "--",
            "sh", "-c", 'hostname "$0" && exec "$@"', plan.hostname, *argv,
        ]  # fmt: skip
        with open(run.log_path, "ab") as log:
            return subprocess.Popen(
                wrapped,
                env=full_env,
                cwd=str((mounts or {}).get("/tmp", self.workdir)),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def start(self, plan: JobPlan) -> None:
        if self.plan is not None:
            raise EmulationError("one job per EmulatedCluster")
        self.plan = plan
        self.started_at = time.monotonic()  # the job's status.startTime (its deadline counts)
        for claim in plan.claims:
            made = self.storage.add_claim(claim)
            if made.phase != "Bound":
                self.status.events.append(f"claim {made.name} Pending: {made.reason}")
        if self.trainjob_status and plan.kind == "TrainJob":
            self._serve_trainjob_status(plan)
        for pod in plan.deployments:  # e.g. the checkpoint keeper, before the job's pods
            self._create_pod(pod, 0)
        for pod in plan.pods:
            self.status.restarts[pod.name] = 0
            self._create_pod(pod, 0)

    def _serve_trainjob_status(self, plan: JobPlan) -> None:
        """Trainer's status server behind its Service name (on the bridge namespace's address),
        its plugin applied to the pods, and the CA ConfigMap its Build makes."""
        url = urlsplit(status_url(NAMESPACE, plan.name))
        assert url.hostname and url.port
        address = str(POD_NETWORK[1])
        listener = listen_in_namespace(self.bridge_ns, address, url.port)
        credentials = trainer_status_server.Credentials(self.workdir / "trainer", (url.hostname,))
        server = trainer_status_server.TrainerStatusServer(
            credentials, {(NAMESPACE, plan.name)}, listener
        )
        server.thread.start()
        self.status_server = server
        self.services[address] = [url.hostname]
        with_trainjob_status(plan, NAMESPACE)
        plan.configmaps[f"{plan.name}-tls-config"] = {"ca.crt": credentials.ca_file.read_text()}

    def kill_pod(self, name: str, sig: int = signal.SIGKILL) -> None:
        """A node loss (SIGKILL of every process) or any signal to all of the pod's processes."""
        run = self.pods[name]
        for pid in netns_pids(run.ns):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    def lose_nodes(self, *names: str) -> None:
        """The nodes of these pods are lost: every process SIGKILLed (the job's pods end 137,
        as the operator sees them); a Deployment's pod waits for its eviction (tick)."""
        for name in names:
            run = self.pods[name]
            self.kill_pod(name, signal.SIGKILL)
            if run.plan.replica_type == "Deployment":
                run.evict_at = time.monotonic() + EVICTION_SECONDS * self.node_loss_scale
                self.status.events.append(f"{name}: node {run.node} ({run.zone}) lost")

    def _evict(self, name: str, run: PodRun) -> None:
        """The node controller evicts the lost node's pod; the ReplicaSet replaces it; its
        volumes stay attached to the lost node until the force-detach."""
        run.done = run.gone = True
        kill_netns_processes(run.ns)
        self._drop_namespace(run.ns)
        detach_at = time.monotonic() + FORCE_DETACH_SECONDS * self.node_loss_scale
        self.storage.node_lost(name, detach_at)
        self.status.events.append(f"{name}: evicted from the lost node {run.node}")
        self._create_pod(run.plan, run.attempt + 1)

    def preempt_pod(self, name: str, grace_seconds: float | None = None) -> None:
        """Scheduler preemption / eviction: the pod gets the DisruptionTarget condition, its
        container's main process SIGTERM, and SIGKILL at the end of the grace period."""
        run = self.pods[name]
        run.conditions.add(DISRUPTION_TARGET)
        grace = run.plan.termination_grace_seconds if grace_seconds is None else grace_seconds
        run.kill_at = time.monotonic() + grace
        if run.popen is not None and run.popen.poll() is None:
            run.popen.send_signal(signal.SIGTERM)  # what tini (PID 1) passes on

    # ------------------------------------------------------------ the controllers' loop
    def _ended(self, run: PodRun) -> Ended | None:
        """The pod's main container just ended (or an init container failed), else None."""
        now = time.monotonic()
        if run.kill_at is not None and now >= run.kill_at:
            self.kill_pod(run.plan.name, signal.SIGKILL)
            run.kill_at = None
        if run.init_popen is not None:
            code = run.init_popen.poll()
            if code is None:
                return None
            run.init_exit_codes.append(code)
            if code == 0:
                self._next_step(run)
                return None
            run.init_popen = None
            return Ended(run.plan, None, set(run.conditions))
        if run.popen is None:
            if run.start_at and now >= run.start_at:  # the back-off of a restart is over
                run.start_at = 0.0
                self._start_main(run)
            return None
        code = run.popen.poll()
        if code is None or run.exit_code is not None:
            return None
        run.exit_code = 128 - code if code < 0 else code
        run.ended_at = now
        run.message = self._termination_message(run)
        return Ended(run.plan, run.exit_code, set(run.conditions))

    def _termination_message(self, run: PodRun) -> str:
        """What the container wrote to its termination log; after a failure with nothing
        written, the log's tail (terminationMessagePolicy FallbackToLogsOnError)."""
        path = run.log_path.with_suffix(".termination-log")
        text = path.read_text(errors="replace") if path.exists() else ""
        policy = run.plan.container.get("terminationMessagePolicy", "File")
        if not text and run.exit_code and policy == "FallbackToLogsOnError":
            tail = run.output().splitlines()[-FALLBACK_LINES:]
            text = "\n".join(tail).encode()[-FALLBACK_BYTES:].decode(errors="replace")
        return text

    def tick(self) -> JobStatus:
        assert self.plan is not None
        if self.status.phase != "Running":
            return self.status
        now = time.monotonic()
        deadline = past_deadline(self.plan, now - self.started_at)
        if deadline is not None:  # every pod stopped, the job failed: no retry
            self.pending.clear()
            for run in self.pods.values():
                if not run.gone:
                    kill_netns_processes(run.ns)
                    run.done = True
            self.status.phase = "Failed"
            self.status.reason = deadline.reason
            self.status.events.append(f"job: {deadline.action} {deadline.reason}")
            return self.status
        for name, (at, plan, attempt) in list(self.pending.items()):
            if now >= at:
                del self.pending[name]
                self._create_pod(plan, attempt)
        for name, run in list(self.pods.items()):
            if run.done:
                continue
            if run.pending:
                self._schedule(run)
                continue
            if run.evict_at is not None:  # on a lost node: nothing runs, nothing restarts
                if now >= run.evict_at:
                    self._evict(name, run)
                continue
            ended = self._ended(run)
            if ended is None:
                continue
            if run.plan.replica_type == "Deployment":  # restartPolicy Always, not the job's
                kill_netns_processes(run.ns)
                self.status.events.append(f"{name}: exit {ended.exit_code} -> restart")
                run.restarts += 1
                run.popen = None
                run.start_at = time.monotonic() + self.restart_delay_seconds
                continue
            # The container's end takes its other processes (torchrun's workers) with it.
            kill_netns_processes(run.ns)
            decision = decide(self.plan, self.status.counters, ended)
            self.status.events.append(
                f"{name}: exit {ended.exit_code} -> {decision.action} {decision.reason}".strip()
            )
            if decision.action == SUCCEEDED:
                run.done = True
                self.status.counters.failures_since_success = 0
            elif decision.action == FAIL and self.plan.kind == "TrainJob":
                action, why = jobset_on_job_failure(
                    self.plan.jobset_failure_policy,
                    self.status.counters,
                    job_failure_reason(decision),
                )
                self.status.events.append(f"JobSet: {action} {why}")
                if action != RESTART_JOBSET:
                    self.status.phase = "Failed"
                    self.status.reason = (
                        f"pod {name} exited {ended.exit_code}: {decision.reason}; {why}"
                    )
                    return self.status
                self._restart_jobset()
                return self.status
            elif decision.action == FAIL:
                self.status.phase = "Failed"
                self.status.reason = f"pod {name} exited {ended.exit_code}: {decision.reason}"
                return self.status
            elif decision.action == RESTART_IN_PLACE:
                self.status.restarts[name] += 1
                run.restarts += 1
                run.popen = None
                run.start_at = time.monotonic() + self.restart_delay_seconds
            else:
                assert decision.action == RECREATE
                self.status.restarts[name] += 1
                run.done = True
                run.gone = True
                self._drop_namespace(run.ns)
                self.storage.release(name)  # the old pod is deleted: its volumes detach
                delay = 0.0
                if self.plan.batch_job:
                    failures = self.status.counters.failures_since_success
                    delay = job_recreation_delay(failures) * self.job_backoff_scale
                if delay > 0:
                    self.pending[name] = (time.monotonic() + delay, run.plan, run.attempt + 1)
                    self.status.events.append(f"{name}: recreated in {delay:.0f}s (back-off)")
                    self._write_hosts()
                else:
                    self._create_pod(run.plan, run.attempt + 1)
        done = {n for n, r in self.pods.items() if r.done and r.exit_code == 0}
        if job_succeeded(self.plan, done):
            self.status.phase = "Succeeded"
        return self.status

    def _restart_jobset(self) -> None:
        """JobSet restartStrategy Recreate: every child Job is deleted with its pods and made
        again (new Job objects: their counters and back-off start from zero)."""
        assert self.plan is not None
        self.pending.clear()
        for run in list(self.pods.values()):
            if not run.gone:
                kill_netns_processes(run.ns)
                run.done = run.gone = True
                self._drop_namespace(run.ns)
        counters = self.status.counters
        counters.failed = counters.restarts = counters.failures_since_success = 0
        for pod in self.plan.pods:
            self.status.restarts[pod.name] += 1
            self._create_pod(pod, self.pods[pod.name].attempt + 1)

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
        events = "\n".join(self.status.events[-30:])
        return "\n".join(r.tail() for r in self.history) + f"\n--- events ---\n{events}"

    def search_logs(self, pattern: str) -> re.Match[str] | None:
        return re.search(pattern, self.all_logs(), re.MULTILINE)

    def volume(self, key_prefix: str) -> Path:
        matches = [p for k, p in self.volumes.items() if k.startswith(key_prefix)]
        if len(matches) != 1:
            raise EmulationError(f"volume {key_prefix!r}: found {sorted(self.volumes)}")
        return matches[0]

    def pod_objects(self) -> list[dict[str, Any]]:
        """The job's pods as the API would list them: phase, restartCount, and the container's
        current or last end with its termination message (what `kubeddp status` reads)."""
        found = []
        for name, run in self.pods.items():
            terminated = {}
            if run.exit_code is not None:
                terminated = {"exitCode": run.exit_code, "message": run.message}
            state = {"terminated": terminated} if terminated else {"running": {}}
            phase = "Running" if not terminated else (
                "Succeeded" if run.exit_code == 0 else "Failed"
            )  # fmt: skip
            container = {"name": run.plan.container.get("name"), "restartCount": run.restarts}
            found.append({
                "metadata": {"name": name, "labels": dict(run.plan.labels)},
                "spec": {"nodeName": f"emulated-{run.ns}"},
                "status": {"phase": phase, "containerStatuses": [{**container, "state": state}]},
            })  # fmt: skip
        return found

    def job_object(self) -> dict[str, Any]:
        """The job as the emulated API serves it: its conditions and, for a TrainJob whose
        controller has the status server, the latest status.trainerStatus posted to it."""
        assert self.plan is not None
        name = self.plan.name
        status: dict[str, Any] = {"conditions": self.job_conditions()}
        server = self.status_server
        latest = server.latest(NAMESPACE, name) if server is not None else None
        if latest is not None:
            status["trainerStatus"] = latest
        metadata = {"name": name, "namespace": NAMESPACE}
        return {"kind": self.plan.kind, "metadata": metadata, "status": status}

    def job_conditions(self) -> list[dict[str, str]]:
        """The job's status.conditions: Succeeded/Complete or Failed with the reason."""
        if self.status.phase == "Running":
            return [{"type": "Running", "status": "True", "reason": "Running", "message": ""}]
        kind = self.plan.kind if self.plan else ""
        done = "Succeeded" if kind == "PyTorchJob" else "Complete"
        kind_type = done if self.status.phase == "Succeeded" else "Failed"
        return [
            {"type": kind_type, "status": "True", "reason": kind_type,
             "message": self.status.reason}
        ]  # fmt: skip

    # ------------------------------------------------------------ cleanup
    def close(self) -> None:
        if self.status_server is not None:
            self.status_server.stop()
        for run in self.pods.values():
            for popen in (run.popen, run.init_popen):
                if popen is not None and popen.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(popen.pid, signal.SIGKILL)
        errors = []
        for ns in list(reversed(self._namespaces)):
            try:
                self._drop_namespace(ns)
            except EmulationError as exc:
                errors.append(str(exc))
        for run in self.history:
            for popen in (run.popen, run.init_popen):
                if popen is not None:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        popen.wait(5)
        if self._owns_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
        if errors:
            raise EmulationError("; ".join(errors))
