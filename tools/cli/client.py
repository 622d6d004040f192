"""kubeddp's Python API, published as `kubeddp.client`: the command line's manifest and cluster
commands as methods of `Client` (render, validate, submit, status, wait, logs, delete,
diagnose), with the same options, the same checks and the same transports (the `kubernetes`
client when installed, else `kubectl proxy`). The CLI (tools/cli/main.py) is a thin layer over it:
it parses, calls, prints.

A failure is a KubeddpError whose message is the line the command prints and whose
`exit_code` is the command's. Notes and warnings (the storage a job uses, validation that fell
back offline) go to `say`: stderr by default, as on the command line.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from kubeddp.tools.cli.client_errors import KubeddpError, WaitTimeout, failing_as
from kubeddp.tools.cluster.job_logs import LogLine
from kubeddp.trainer import exit_codes, yaml_io

SCHEMA_SOURCES = ("auto", "cluster", "offline")
CRD_LOOKUP_TIMEOUT = 5  # seconds: `auto` validation falls back offline when the cluster is slow
DRY_RUNS = ("none", "client", "server")

__all__ = [
    "Client",
    "JobEnd",
    "JobStatus",
    "KubeddpError",
    "LogLine",
    "Manifests",
    "Validated",
    "WaitTimeout",
]


def _spawn_refusal(args: Any) -> str | None:
    """launch's refusal of a program that starts its own workers on several nodes."""
    if not getattr(args, "script", None):
        return None
    from kubeddp.trainer.launcher.program_options import script_spawn_refusal

    nodes = getattr(args, "elastic", None) or getattr(args, "nnodes", None)
    return script_spawn_refusal(args.script, nodes, getattr(args, "spawns_workers", None))


def _stderr(line: str) -> None:
    from kubeddp.tools.cli.output import say

    say(line)


@dataclass
class Manifests:
    """A job's validated objects, in the order they are applied."""

    documents: list[dict]

    def yaml(self) -> str:
        from kubeddp.tools.manifests.chart.render import to_yaml

        return to_yaml(self.documents)

    def json(self) -> str:
        from kubeddp.tools.manifests.chart.render import to_json

        return to_json(self.documents)


@dataclass
class Validated:
    """`validate`: the problems found (one line each), and what was read."""

    problems: list[str]
    documents: int
    files: int


class JobStatus(dict):
    """`status` as data: what `kubeddp status -o json` prints; `str()` is the text form."""

    @property
    def state(self) -> str:
        return str(self["state"])

    def __str__(self) -> str:
        from kubeddp.tools.cluster.job_status import status_lines

        return "\n".join(status_lines(self))


@dataclass(frozen=True)
class JobEnd:
    """How a job ended: `state` is "Succeeded" or "Failed"; `str()` the line wait prints."""

    state: str
    line: str

    @property
    def succeeded(self) -> bool:
        return self.state == "Succeeded"

    def __str__(self) -> str:
        return self.line


@dataclass
class Client:
    """The cluster a command talks to, chosen as kubectl chooses it: `kubeconfig` (default
    $KUBECONFIG, ~/.kube/config, else the pod's service account), `context`, `namespace`
    (default: the context's). `request_timeout`: how long one API call may wait for its answer
    (seconds or a duration such as "30s"; default 30). The connection (and a `kubectl proxy`)
    is opened at the first call that needs it and kept until `close()` or the end of a `with`.
    """

    kubeconfig: str | None = None
    context: str | None = None
    namespace: str | None = None
    request_timeout: float | str | None = None
    say: Callable[[str], None] = _stderr
    _cluster: Any = field(default=None, init=False, repr=False)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        if self._cluster is not None:
            self._cluster.close()
            self._cluster = None

    # ---- the connection ------------------------------------------------------------------

    def _timeout(self) -> float | None:
        if self.request_timeout is None:
            return None
        return _seconds("request_timeout", self.request_timeout, low=1, above=False)

    def cluster(self) -> Any:
        """The open connection (tools/cluster/kube.py's Cluster), opened now if it is not yet."""
        if self._cluster is None:
            from kubeddp.tools.cluster.kube import DEFAULT_REQUEST_TIMEOUT, Cluster

            seconds = self._timeout() or DEFAULT_REQUEST_TIMEOUT
            self._cluster = Cluster(self.kubeconfig, self.context, self.namespace, seconds)
        return self._cluster

    def _crd_schemas(self, docs: list[dict], against: str, command: str) -> dict[str, dict]:
        """CRDs from the cluster for `against` cluster|auto; {} means offline."""
        from kubeddp.tools.cluster.kube import KubeError
        from kubeddp.tools.manifests.kinds import KINDS

        if against not in SCHEMA_SOURCES:
            raise KubeddpError(
                f"validate_against {against!r} is not one of {', '.join(SCHEMA_SOURCES)}",
                exit_codes.BAD_INPUT,
                command,
            )
        custom = {kind.resource.key for kind in KINDS.values() if kind.custom_resource}
        keys = sorted({f"{d.get('apiVersion')}/{d.get('kind')}" for d in docs} & custom)
        if against == "offline" or not keys:
            return {}
        try:
            cluster = self.cluster()
            if self._timeout() is None:
                cluster = cluster.with_timeout(CRD_LOOKUP_TIMEOUT)
            return cluster.crd_schemas(keys)
        except KubeError as exc:
            if against == "cluster":
                raise
            if "no Kubernetes credentials" not in str(exc):
                self.say(f"kubeddp {command}: note: validating offline ({exc})")
            return {}

    # ---- manifests -----------------------------------------------------------------------

    def render(
        self,
        kind: str | None = None,
        *,
        validate_against: str = "auto",
        program_args: list[str] | None = None,
        **options: Any,
    ) -> Manifests:
        """`kubeddp render KIND --option ...`: the job's objects, validated. `options`: those
        of `kubeddp render --help`, named as in Python (tools/cli/render_call.py). No `kind`:
        an Indexed Job (render reads no cluster), said first on `say`."""
        with failing_as("render"):
            docs = self._rendered("render", kind, options, program_args, validate_against)
            script = options.get("script")
            if script:  # when the image's script is here too: its pitfalls
                from kubeddp.trainer.script_check.checks import warnings_for

                nodes = options.get("elastic") or options.get("nnodes") or options.get("nodes")
                for line in warnings_for(script, nodes or 1, program_args or []):
                    self.say(f"kubeddp render: warning: {line}")
            return Manifests(docs)

    def _rendered(
        self,
        command: str,
        kind: str | None,
        options: dict[str, Any],
        program_args: list[str] | None,
        against: str,
    ) -> list[dict]:
        from kubeddp.tools.cli.render_call import render_args
        from kubeddp.tools.manifests.chart.render import render_documents
        from kubeddp.tools.manifests.chart.render_options import values_from_args
        from kubeddp.tools.manifests.validate import validate_documents

        notes: list[str] = []
        args = render_args(self._kind_for(command, kind), options, program_args)
        refusal = _spawn_refusal(args)
        if refusal:  # what launch would refuse in every pod, refused before the job exists
            raise KubeddpError(refusal, exit_codes.BAD_INPUT, command)
        docs = render_documents(*values_from_args(args), notes=notes)
        self._refuse_problems(
            command, validate_documents(docs, command, self._crd_schemas(docs, against, command))
        )
        self._warn(command, docs, command)
        for line in notes:  # which storage the job uses, what the cluster must offer
            self.say(f"kubeddp {command}: {line}")
        if command == "render":  # submit reads the StorageClass (_check_storage)
            from kubeddp.tools.cluster.keeper_zones import zone_lines

            for line in zone_lines(docs, None):
                self.say(f"kubeddp {command}: {line}")
        return docs

    def _kind_for(self, command: str, kind: str | None) -> str:
        """The kind given, else render's offline kind or, for submit, the kind the cluster
        serves (its API discovery, by the chart's `kind: auto` rule); said in the first line."""
        from kubeddp.tools.manifests.kinds import AUTO_ORDER, KINDS, OFFLINE_KIND

        if kind is not None:
            return kind
        if command == "render":
            others = " or ".join(name for name in AUTO_ORDER if name != OFFLINE_KIND)
            offline = KINDS[OFFLINE_KIND].chart_kind
            self.say(
                f"kubeddp render: note: no KIND given: rendering an {offline} (needs no "
                f"operator; render reads no cluster); name {others} for an operator's kind, or "
                "let `kubeddp submit` pick the kind the cluster serves"
            )
            return OFFLINE_KIND
        from kubeddp.tools.cluster.api_discovery import discovered_kind

        picked, why = discovered_kind(self.cluster())
        self.say(f"kubeddp {command}: kind {picked.name}: {why} (name a KIND to choose)")
        return picked.name

    @staticmethod
    def _refuse_problems(command: str, problems: list[Any]) -> None:
        if problems:
            lines = [str(p) for p in problems]
            message = lines[0] if len(lines) == 1 else f"{len(lines)} problems: {'; '.join(lines)}"
            raise KubeddpError(message, exit_codes.BAD_INPUT, command, lines)

    def _warn(self, command: str, docs: list[dict], source: str) -> None:
        from kubeddp.tools.manifests.validate import document_warnings

        for warning in document_warnings(docs, source):
            self.say(f"kubeddp {command}: warning: {warning}")

    def validate(
        self, *files: str, documents: list[dict] | None = None, validate_against: str = "auto"
    ) -> Validated:
        """`kubeddp validate FILE...` (- = stdin), or `documents` given as objects: the
        problems found. A file that cannot be read is a KubeddpError (exit code 2)."""
        from kubeddp.tools.manifests.validate import load_documents, validate_documents

        with failing_as("validate"):
            sources = [(name, load_documents(text, name)) for name, text in read_files(files)]
            if documents is not None:
                sources.append(("<documents>", list(documents)))
            all_docs = [doc for _, docs in sources for doc in docs]
            crds = self._crd_schemas(all_docs, validate_against, "validate")
            problems = [
                str(p) for name, docs in sources for p in validate_documents(docs, name, crds)
            ]
            if not problems:  # only for valid manifests: an error stays one line
                for name, docs in sources:
                    self._warn("validate", docs, name)
            return Validated(problems, len(all_docs), len(sources))

    def submit(
        self,
        kind: str | None = None,
        *,
        filename: str | None = None,
        manifests: Manifests | list[dict] | None = None,
        dry_run: str = "none",
        validate_against: str = "auto",
        program_args: list[str] | None = None,
        **options: Any,
    ) -> list[str]:
        """`kubeddp submit`: validate, then create the objects of a rendered job (render
        options, with KIND or else the kind the cluster serves), of a manifest file
        (`filename`, - = stdin) or of `manifests`. A line for each object created (with
        dry_run="client": nothing is created, the YAML is the one line)."""
        done: list[str] = []
        with failing_as("submit", done):
            docs = self._to_submit(
                kind, filename, manifests, options, program_args, validate_against
            )
            if dry_run not in DRY_RUNS:
                raise KubeddpError(
                    f"dry_run {dry_run!r} is not one of {', '.join(DRY_RUNS)}",
                    exit_codes.BAD_INPUT,
                    "submit",
                )
            if dry_run == "client":
                return [Manifests(docs).yaml()]
            from kubeddp.tools.cluster import jobs

            cluster = self.cluster()
            self._check_storage(cluster, docs)
            for line in jobs.submit(cluster, docs, dry_run == "server"):
                done.append(line)
            return done

    def _to_submit(
        self,
        kind: str | None,
        filename: str | None,
        manifests: Manifests | list[dict] | None,
        options: dict[str, Any],
        program_args: list[str] | None,
        against: str,
    ) -> list[dict]:
        from kubeddp.tools.manifests.validate import load_documents, validate_documents

        given = [what for what in (kind, filename, manifests) if what is not None]
        if len(given) > 1:
            raise KubeddpError(
                "give either -f FILE or KIND with render options, not both",
                exit_codes.BAD_INPUT,
                "submit",
            )
        if filename is None and manifests is None:  # render options, KIND or the cluster's
            return self._rendered("submit", kind, options, program_args, against)
        if filename is not None:
            ((name, text),) = read_files([filename])
            docs = load_documents(text, name)
        else:
            name = "<manifests>"
            docs = list(manifests.documents if isinstance(manifests, Manifests) else manifests)
        if not docs:
            raise KubeddpError(
                f"{name} holds no Kubernetes objects; nothing to submit",
                exit_codes.BAD_INPUT,
                "submit",
            )
        problems = validate_documents(docs, name, self._crd_schemas(docs, against, "submit"))
        self._refuse_problems("submit", problems)
        self._warn("submit", docs, name)
        return docs

    def _check_storage(self, cluster: Any, docs: list[dict]) -> None:
        """The checkpoint claim against the cluster's StorageClasses where they can be read:
        a claim that would stay Pending is refused (one line), the rest a note."""
        from kubeddp.tools.cluster.keeper_zones import zone_lines
        from kubeddp.tools.cluster.kube import KubeError
        from kubeddp.tools.cluster.storage_classes import check_claim, claims_of

        claims = claims_of(docs)
        if not claims:
            return
        try:
            classes = cluster.storage_classes()
        except KubeError as exc:
            self.say(f"kubeddp submit: note: StorageClasses not checked ({exc})")
            return
        for claim in claims:
            self.say(f"kubeddp submit: checkpoints: {check_claim(claim, classes)}")
        for line in zone_lines(docs, classes):
            self.say(f"kubeddp submit: {line}")

    # ---- jobs on the cluster ---------------------------------------------------------------

    def _job(self, name: str, kind: str | None, read: bool = True) -> Any:
        """The job (tools/cluster/job_lookup.py's FoundJob); `read=False`: when the kind is given,
        the job object is not needed (delete, diagnose) and not read."""
        from kubeddp.tools.cluster.job_lookup import FoundJob, find_job
        from kubeddp.tools.cluster.kube import KubeInputError, checked_name
        from kubeddp.tools.manifests.kinds import KINDS

        checked_name(name, "name")
        if kind is not None and kind not in KINDS:
            raise KubeInputError(f"kind {kind!r} is not one of {', '.join(KINDS)}")
        if kind is not None and not read:
            return FoundJob(KINDS[kind], {})
        return find_job(self.cluster(), name, kind)

    def status(self, name: str, kind: str | None = None) -> JobStatus:
        """`kubeddp status NAME`: state, conditions, replicas, progress and each pod. `kind`:
        pytorchjob, trainjob or indexedjob; by default the kind that has a job of that name."""
        from kubeddp.tools.cluster.job_status import status_report

        with failing_as("status"):
            found = self._job(name, kind)
            return JobStatus(status_report(self.cluster(), found, name))

    def wait(
        self,
        name: str,
        kind: str | None = None,
        timeout: float | str = 3600,
        interval: float | str = 5,
    ) -> JobEnd:
        """`kubeddp wait NAME`: how the job ended (`.state` "Succeeded" or "Failed"), once it
        has; WaitTimeout (exit code 124) if it still runs after `timeout` (seconds, or a
        duration: "10m"). `interval`: how often to look."""
        from kubeddp.tools.cluster import jobs

        with failing_as("wait"):
            timeout_s = _seconds("timeout", timeout, low=0, above=False)
            interval_s = _seconds("interval", interval, low=0, above=True)
            state, line = jobs.wait(
                self.cluster(), self._job(name, kind), name, timeout_s, interval_s
            )
            if state is None:
                raise WaitTimeout(line, exit_codes.WAIT_TIMEOUT, "wait")
            return JobEnd(state, line)

    def logs(
        self,
        name: str,
        kind: str | None = None,
        *,
        replica: str | None = None,
        node_rank: int | None = None,
        follow: bool = False,
        tail: int | None = None,
    ) -> Iterator[LogLine]:
        """`kubeddp logs NAME`: the lines of the job's pods (`str(line)` is `[pod] text`),
        as they are now or, with `follow`, as they come until the job ends (pods that are
        recreated join). `replica`: master|worker (PyTorchJob) or an index; `node_rank`: only
        the pod of that node rank; `tail`: the last N lines of each pod."""
        from kubeddp.tools.cluster import job_logs
        from kubeddp.tools.cluster.kube_errors import KubeInputError

        with failing_as("logs"):
            for what, value in (("tail", tail), ("node_rank", node_rank)):
                if value is not None and (type(value) is not int or value < 0):
                    raise KubeInputError(f"{what} {value!r} must be an integer >= 0")
            found = self._job(name, kind, read=node_rank is not None)
            cluster = self.cluster()
            selector = job_logs.selector(found.kind, found.job, name, replica, node_rank)
            if follow:
                follower = job_logs.Follower(cluster, found, name, selector, tail)
                lines = follower.lines_until_the_end()
            else:
                pods = [p["metadata"]["name"] for p in cluster.list_pods(selector)]
                if not pods:
                    raise job_logs.no_pods(found.kind, name, cluster.namespace)
                lines = job_logs.read_logs(cluster, found.kind, pods, tail)
        return _failing_lines("logs", lines)

    def delete(self, name: str, kind: str | None = None, *, delete_pvc: bool = False) -> list[str]:
        """`kubeddp delete NAME`: the job, then the objects render made beside it; a line for
        each object deleted. `delete_pvc`: also the checkpoint claim <name>-checkpoints."""
        from kubeddp.tools.cluster import jobs

        done: list[str] = []
        with failing_as("delete", done):
            found = self._job(name, kind, read=False)
            for line in jobs.delete(self.cluster(), found.kind, name, delete_pvc):
                done.append(line)
        return done

    def diagnose(self, name: str, kind: str | None = None) -> list[str]:
        """`kubeddp diagnose NAME`: the stall reports in the job's pod logs (none: [])."""
        from kubeddp.tools.cluster.diagnosis import stall_reports

        with failing_as("diagnose"):
            found = self._job(name, kind, read=False)
            return stall_reports(self.cluster(), found.kind, name, self.say)


def _failing_lines(command: str, lines: Iterator[Any]) -> Iterator[Any]:
    with failing_as(command):
        yield from lines


def _seconds(what: str, value: float | str, *, low: float, above: bool) -> float:
    """A time given as seconds or a duration ("90s", "10m"), checked as the CLI checks it."""
    import argparse

    from kubeddp.tools.cluster.kube_errors import KubeInputError
    from kubeddp.trainer.arguments import duration

    try:
        return duration(low, above=above)(str(value))
    except argparse.ArgumentTypeError as exc:
        raise KubeInputError(f"{what}: {exc}") from None


def read_files(files: tuple[str, ...] | list[str]) -> list[tuple[str, str]]:
    """(name, text) of each file (- = stdin), through the bounded text reader; ManifestError
    for a file that cannot be read or is not text."""
    from kubeddp.tools.manifests.validate import ManifestError

    out = []
    for name in files:
        try:
            if name == "-":
                out.append(("<stdin>", _read_stdin()))
            else:
                out.append((os.fspath(name), yaml_io.read_text(os.fspath(name))))
        except OSError as exc:
            raise ManifestError(f"cannot read {name} ({exc.strerror or exc})") from None
        except UnicodeDecodeError:  # a text-mode stdin that is not UTF-8
            raise ManifestError(f"{name} is not UTF-8 text; save it as UTF-8") from None
        except yaml_io.YamlInputError as exc:
            raise ManifestError(str(exc)) from None
    return out


def _read_stdin() -> str:
    stream = getattr(sys.stdin, "buffer", None)  # bytes when stdin is a file or a pipe
    if stream is None:
        return yaml_io.decode_text(sys.stdin.read(yaml_io.MAX_BYTES + 1).encode(), "<stdin>")
    return yaml_io.decode_text(stream.read(yaml_io.MAX_BYTES + 1), "<stdin>")
