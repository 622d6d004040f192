"""The `kubeddp` command line: `launch`/`train` run training; the rest handle manifests, clusters.

Heavy imports (torch, the Kubernetes client) happen inside each subcommand so `kubeddp --help`
is instant.
"""

from __future__ import annotations

import argparse
import os
import sys

from kubeddp.trainer import __version__, exit_codes, yaml_io
from kubeddp.trainer.arguments import OneLineErrorParser, duration, number

EXIT_BAD_INPUT = exit_codes.BAD_INPUT
SCHEMA_SOURCES = ("auto", "cluster", "offline")
# The `cli` extra: what render, validate, submit and the cluster commands import (the cluster
# commands reach the API through kubectl, or the `kube` extra's client: tools/kube_transport.py).
CLI_EXTRA_MODULES = ("jsonschema",)
INSTALL_CLI_EXTRA = "pip install 'kubeddp[cli]'"
CRD_LOOKUP_TIMEOUT = 5  # seconds: `auto` validation falls back offline when the cluster is slow
DEBUG_ENV = "KUBEDDP_DEBUG"  # =1: an internal error shows its traceback


def main(argv: list[str] | None = None) -> int:
    """Every command ends with a code of trainer/exit_codes.py: Ctrl-C is INTERRUPTED, and
    anything unexpected is one INTERNAL_ERROR line (KUBEDDP_DEBUG=1 shows the traceback)."""
    if argv is None:  # the `kubeddp` command itself: launch's last moments ignore SIGTERM
        from kubeddp.trainer.launcher import end_signals

        end_signals.PROCESS_ENDS_WITH_LAUNCH = True
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[0] if argv and not argv[0].startswith("-") else "kubeddp"
    from kubeddp.tools.output import OutputError, checked_stdout

    try:
        if command in ("launch", "train") and "--dry-run" not in argv:
            return _dispatch(argv)  # training's output is its workers' own
        with checked_stdout():
            return _dispatch(argv)
    except OutputError as exc:
        return _fail(command, f"{exc}; the command stopped", exit_codes.TRAINING_FAILED)
    except KeyboardInterrupt:
        print(f"kubeddp {command}: interrupted", file=sys.stderr)
        return exit_codes.INTERRUPTED
    except Exception as exc:  # noqa: BLE001 - the last line of defence: one line, not a trace
        if os.environ.get(DEBUG_ENV) == "1":
            raise
        what = " ".join(str(exc).split())[:300]
        return _fail(
            command,
            f"internal error: {type(exc).__name__}: {what} (a bug in kubeddp; please report "
            f"it; {DEBUG_ENV}=1 shows the traceback)",
            exit_codes.INTERNAL_ERROR,
        )
    finally:
        _stop_kubectl_proxies()


def _stop_kubectl_proxies() -> None:
    """A cluster command's `kubectl proxy` ends with the command, also after an error or
    Ctrl-C (only where one may have been started: the module is then imported)."""
    started = sys.modules.get("kubeddp.tools.kubectl_proxy")
    if started is not None:
        started.close_all()


def _dispatch(argv: list[str]) -> int:
    if argv and argv[0] == "launch":
        from kubeddp.trainer.launcher.launch import launch_main

        return launch_main(argv[1:])
    if argv and argv[0] == "train":
        from kubeddp.trainer.launcher.launch import train_main

        return train_main(argv[1:])
    if argv and argv[0] == "keeper":  # the checkpoint keeper pod's command
        from kubeddp.trainer.launcher.checkpoint_keeper import keeper_main

        return keeper_main(argv[1:])
    if argv and argv[0] == "check":
        return cmd_check(argv[1:])
    args = parse_command(argv)
    if not getattr(args, "handler", None):
        build_parser().print_usage(sys.stderr)
        return EXIT_BAD_INPUT
    from kubeddp.tools.helm_engine import HelmUnavailable

    try:
        return args.handler(args)
    except HelmUnavailable as exc:  # render needs Helm: the binary or the `helm` extra
        return _fail(argv[0], str(exc))
    except ModuleNotFoundError as exc:  # a plain `pip install kubeddp` has no `cli` extra
        if (exc.name or "").split(".")[0] not in CLI_EXTRA_MODULES:
            raise
        return _fail(
            argv[0],
            f"this command needs the CLI's libraries ({exc.name} is not installed); "
            f"install them with: {INSTALL_CLI_EXTRA}",
        )


def parse_command(argv: list[str]) -> argparse.Namespace:
    """The options of a manifest or cluster command. For render and submit, what follows `--`
    is the user program's arguments (trainer.args), kept as written: `program_args`."""
    program_args = None
    if argv and argv[0] in ("render", "submit") and "--" in argv:
        cut = argv.index("--")
        argv, program_args = argv[:cut], argv[cut + 1 :]
    args = build_parser().parse_args(argv)
    args.program_args = program_args
    return args


def _kube_name(text: str) -> str:
    from kubeddp.tools.kube import KubeInputError, checked_name

    try:
        return checked_name(text, "name")
    except KubeInputError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _kube_namespace(text: str) -> str:
    from kubeddp.tools.kube import KubeInputError, checked_namespace

    try:
        return checked_namespace(text)
    except KubeInputError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    from kubeddp.tools.chart.render_options import add_render_options
    from kubeddp.tools.kinds import KINDS

    parser = OneLineErrorParser(
        prog="kubeddp", description="PyTorch DDP training on a laptop, in Docker, on Kubernetes."
    )
    parser.add_argument("--version", action="version", version=f"kubeddp {__version__}")
    sub = parser.add_subparsers(metavar="COMMAND")
    sub.add_parser("launch", help="start training from the env an operator injected (in a pod)")
    sub.add_parser("keeper", help="serve a checkpoint claim to a job's pods (the keeper pod)")
    sub.add_parser("train", help="local DDP run (torchrun standalone)")
    sub.add_parser("check", help="name the DDP pitfalls of a training script (without running it)")

    render = sub.add_parser("render", help="print the validated manifests of a job")
    add_render_options(render)
    render.add_argument("-o", "--output", choices=("yaml", "json"), default="yaml")
    _add_schema_source(render)
    _add_cluster_options(render, with_namespace=False)
    render.set_defaults(handler=cmd_render)

    validate = sub.add_parser("validate", help="check manifest files (schema + operator rules)")
    validate.add_argument("files", nargs="+", metavar="FILE", help="YAML/JSON files, - = stdin")
    _add_schema_source(validate)
    _add_cluster_options(validate, with_namespace=False)
    validate.set_defaults(handler=cmd_validate)

    submit = sub.add_parser("submit", help="validate and create a job (a file or render options)")
    add_render_options(submit, kind_required=False)
    submit.add_argument("-f", "--filename", help="submit this manifest file (- = stdin)")
    submit.add_argument("--dry-run", choices=("none", "client", "server"), default="none")
    _add_schema_source(submit)
    _add_cluster_options(submit, with_namespace=False)
    submit.set_defaults(handler=cmd_submit)

    completion = sub.add_parser("completion", help="print a shell completion script")
    completion.add_argument("shell", choices=("bash", "zsh", "fish"))
    completion.set_defaults(handler=cmd_completion)

    for name, help_text in (
        ("status", "conditions, replica counts, pod restarts"),
        ("logs", "logs of the job's pods"),
        ("wait", "wait until Succeeded (exit 0) or Failed (exit 1)"),
        ("delete", "delete the job and its ConfigMap/Service/PodMonitor"),
        ("diagnose", "the stall reports in the job's pod logs (see docs/diagnostics.md)"),
    ):
        cmd = sub.add_parser(name, help=help_text)
        cmd.add_argument("name", metavar="NAME", type=_kube_name)
        cmd.add_argument("--kind", choices=list(KINDS), default=next(iter(KINDS)))
        _add_cluster_options(cmd, with_namespace=True)
        cmd.set_defaults(handler=CLUSTER_HANDLERS[name])
    sub.choices["status"].add_argument(
        "-o", "--output", choices=("text", "json", "yaml"), default="text"
    )
    sub.choices["logs"].add_argument("--replica", help="pytorchjob: master|worker; else an index")
    sub.choices["logs"].add_argument("-f", "--follow", action="store_true")
    sub.choices["logs"].add_argument("--tail", type=number(int, 0), help="last N lines per pod")
    sub.choices["wait"].add_argument(
        "--timeout", type=duration(0), default=3600.0, help="seconds, or 90s, 10m, 1h"
    )
    sub.choices["wait"].add_argument(
        "--interval", type=duration(0, above=True), default=5.0, help="poll seconds, or 30s, 1m"
    )
    sub.choices["delete"].add_argument(
        "--delete-pvc", action="store_true", help="also delete <name>-checkpoints (rendered PVC)"
    )
    return parser


def cmd_check(argv: list[str]) -> int:
    """`kubeddp check [--nodes N] SCRIPT [-- ARGS]`: every finding, one line each (file:line:
    pitfall|advice rule: what; fix); 0 no pitfall (advice is shown), 1 pitfalls, 2 a script
    that cannot be read."""
    from kubeddp.trainer.launcher.script_check import ScriptCheckError, check_file, pitfalls

    own, program_args = (
        (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if ("--" in argv) else (argv, [])
    )
    parser = OneLineErrorParser(
        prog="kubeddp check",
        description="read a training script without running it and name each DDP pitfall "
        "(exit 1) and piece of advice (exit 0) with its line and fix; the program's own "
        "arguments follow --",
    )
    parser.add_argument("script", metavar="SCRIPT", help="the Python file to check")
    parser.add_argument(
        "--nodes", type=number(int, 1), default=1, help="nodes the job runs on (default 1)"
    )
    args = parser.parse_args(own)
    try:
        findings = check_file(args.script, args.nodes, program_args)
    except ScriptCheckError as exc:
        return _fail("check", str(exc))
    for finding in findings:
        print(finding.shown(args.script))
    return exit_codes.TRAINING_FAILED if pitfalls(findings) else exit_codes.OK


def _add_schema_source(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--validate-against",
        choices=SCHEMA_SOURCES,
        default="auto",
        help="CRD schemas: from the cluster, the offline Kubeflow SDK models, or "
        "the cluster when reachable (default)",
    )


def _add_cluster_options(parser: argparse.ArgumentParser, with_namespace: bool) -> None:
    group = parser.add_argument_group("cluster")
    group.add_argument("--kubeconfig", help="default: $KUBECONFIG, ~/.kube/config, in-cluster")
    group.add_argument("--context")
    group.add_argument(
        "--request-timeout",
        type=number(int, 1),
        default=None,
        metavar="SECONDS",
        help="how long one API call may wait for an answer (default 30)",
    )
    if with_namespace:
        group.add_argument("-n", "--namespace", type=_kube_namespace)


def _fail(command: str, message: str, code: int = EXIT_BAD_INPUT) -> int:
    from kubeddp.tools.output import say

    say(f"kubeddp {command}: error: {message}")
    return code


def _connect(args: argparse.Namespace, timeout: int | None = None):
    from kubeddp.tools.kube import DEFAULT_REQUEST_TIMEOUT, Cluster

    seconds = args.request_timeout or timeout or DEFAULT_REQUEST_TIMEOUT
    return Cluster(args.kubeconfig, args.context, getattr(args, "namespace", None), seconds)


def _crd_schemas(args: argparse.Namespace, docs: list[dict]) -> dict[str, dict]:
    """CRDs from the cluster for `--validate-against cluster|auto`; {} means offline."""
    from kubeddp.tools.kinds import KINDS
    from kubeddp.tools.kube import KubeError

    custom = {kind.resource.key for kind in KINDS.values() if kind.custom_resource}
    keys = sorted({f"{d.get('apiVersion')}/{d.get('kind')}" for d in docs} & custom)
    if args.validate_against == "offline" or not keys:
        return {}
    try:
        return _connect(args, timeout=CRD_LOOKUP_TIMEOUT).crd_schemas(keys)
    except KubeError as exc:
        if args.validate_against == "cluster":
            raise
        if "no Kubernetes credentials" not in str(exc):
            print(f"kubeddp: note: validating offline ({exc})", file=sys.stderr)
        return {}


def _checked_documents(args: argparse.Namespace, command: str) -> tuple[list[dict], int]:
    """Render options -> validated documents, or ([], exit code) after printing the error."""
    from kubeddp.tools.chart.render import RenderError, render_documents
    from kubeddp.tools.chart.render_options import values_from_args
    from kubeddp.tools.chart.value_types import OptionError
    from kubeddp.tools.kube import KubeError
    from kubeddp.tools.validate import validate_documents

    notes: list[str] = []
    refusal = _spawn_refusal(args)
    if refusal:  # what launch would refuse in every pod, refused before the job exists
        return [], _fail(command, refusal)
    try:
        docs = render_documents(*values_from_args(args), notes=notes)
    except (OptionError, RenderError) as exc:
        return [], _fail(command, str(exc))
    try:
        problems = validate_documents(docs, command, _crd_schemas(args, docs))
    except KubeError as exc:
        return [], _fail(command, str(exc), exc.exit_code)
    if problems:
        for problem in problems:
            print(f"kubeddp {command}: error: {problem}", file=sys.stderr)
        return [], EXIT_BAD_INPUT
    _print_warnings(command, docs, command)
    for line in notes:  # which storage the job uses, what the cluster must offer
        print(f"kubeddp {command}: {line}", file=sys.stderr)
    return docs, 0


def _spawn_refusal(args: argparse.Namespace) -> str | None:
    if not getattr(args, "script", None):
        return None
    from kubeddp.trainer.launcher.program_options import script_spawn_refusal

    nodes = getattr(args, "elastic", None) or getattr(args, "nodes", None)
    return script_spawn_refusal(args.script, nodes, getattr(args, "spawns_workers", None))


def _print_warnings(command: str, docs: list[dict], source: str) -> None:
    from kubeddp.tools.validate import document_warnings

    for warning in document_warnings(docs, source):
        print(f"kubeddp {command}: warning: {warning}", file=sys.stderr)


def cmd_render(args: argparse.Namespace) -> int:
    from kubeddp.tools.chart.render import to_json, to_yaml

    docs, code = _checked_documents(args, "render")
    if code:
        return code
    if getattr(args, "script", None):  # when the image's script is here too: its pitfalls
        from kubeddp.trainer.launcher.script_check import warnings_for

        nodes = args.elastic or args.nodes
        for line in warnings_for(args.script, nodes, args.program_args or []):
            print(f"kubeddp render: warning: {line}", file=sys.stderr)
    sys.stdout.write(to_yaml(docs) if args.output == "yaml" else to_json(docs))
    return 0


def cmd_completion(args: argparse.Namespace) -> int:
    from kubeddp.tools.completion import script

    sys.stdout.write(script(args.shell, build_parser()))
    return 0


def _read_stdin() -> str:
    stream = getattr(sys.stdin, "buffer", None)  # bytes when stdin is a file or a pipe
    if stream is None:
        return yaml_io.decode_text(sys.stdin.read(yaml_io.MAX_BYTES + 1).encode(), "<stdin>")
    return yaml_io.decode_text(stream.read(yaml_io.MAX_BYTES + 1), "<stdin>")


def _read_files(files: list[str]) -> list[tuple[str, str]]:
    """(name, text) of each file (- = stdin), through the bounded text reader; ManifestError
    for a file that cannot be read or is not text."""
    from kubeddp.tools.validate import ManifestError

    out = []
    for name in files:
        try:
            if name == "-":
                out.append(("<stdin>", _read_stdin()))
            else:
                out.append((name, yaml_io.read_text(name)))
        except OSError as exc:
            raise ManifestError(f"cannot read {name} ({exc.strerror or exc})") from None
        except UnicodeDecodeError:  # a text-mode stdin that is not UTF-8
            raise ManifestError(f"{name} is not UTF-8 text; save it as UTF-8") from None
        except yaml_io.YamlInputError as exc:
            raise ManifestError(str(exc)) from None
    return out


def cmd_validate(args: argparse.Namespace) -> int:
    """Exit 0: valid; 1: problems found (printed on stdout); 2: a file that cannot be read
    or is not YAML objects; 3: --validate-against cluster and the cluster cannot be used."""
    from kubeddp.tools.kube import KubeError
    from kubeddp.tools.validate import ManifestError, load_documents, validate_documents

    try:
        sources = [(name, load_documents(text, name)) for name, text in _read_files(args.files)]
        all_docs = [doc for _, docs in sources for doc in docs]
        crds = _crd_schemas(args, all_docs)
    except ManifestError as exc:
        return _fail("validate", str(exc))
    except KubeError as exc:
        return _fail("validate", str(exc), exc.exit_code)
    problems = [p for name, docs in sources for p in validate_documents(docs, name, crds)]
    for problem in problems:
        print(problem)
    if problems:
        print(
            f"kubeddp validate: error: {len(problems)} problem(s) in {len(all_docs)} documents "
            "(listed above); fix them and validate again",
            file=sys.stderr,
        )
        return exit_codes.TRAINING_FAILED  # the table's "validate: problems found"
    for name, docs in sources:  # only for valid manifests: an error stays one line
        _print_warnings("validate", docs, name)
    print(f"ok: {len(all_docs)} documents in {len(sources)} files", file=sys.stderr)
    return 0


def cmd_submit(args: argparse.Namespace) -> int:
    from kubeddp.tools import jobs
    from kubeddp.tools.chart.render import to_yaml
    from kubeddp.tools.kube import KubeError
    from kubeddp.tools.validate import ManifestError, load_documents, validate_documents

    if args.filename and args.kind:
        return _fail("submit", "give either -f FILE or KIND with render options, not both")
    if not args.filename and not args.kind:
        return _fail("submit", "nothing to submit; give -f FILE or KIND (e.g. pytorchjob)")
    try:
        if args.filename:
            ((name, text),) = _read_files([args.filename])
            docs = load_documents(text, name)
            if not docs:
                return _fail("submit", f"{name} holds no Kubernetes objects; nothing to submit")
            problems = validate_documents(docs, name, _crd_schemas(args, docs))
            for problem in problems:
                print(f"kubeddp submit: error: {problem}", file=sys.stderr)
            if problems:
                return EXIT_BAD_INPUT
            _print_warnings("submit", docs, name)
        else:
            docs, code = _checked_documents(args, "submit")
            if code:
                return code
        if args.dry_run == "client":
            sys.stdout.write(to_yaml(docs))
            return 0
        cluster = _connect(args)
        problem = _storage_problem(cluster, docs)
        if problem:
            return _fail("submit", problem)
        jobs.submit(cluster, docs, args.dry_run == "server", sys.stdout)
    except ManifestError as exc:
        return _fail("submit", str(exc))
    except KubeError as exc:
        return _fail("submit", str(exc), exc.exit_code)
    return 0


def _storage_problem(cluster, docs: list[dict]) -> str:
    """Check the checkpoint claim against the cluster's StorageClasses where they can be read;
    a claim that would stay Pending is a problem (one line), the rest a note."""
    from kubeddp.tools.kube import KubeError
    from kubeddp.tools.storage_classes import StorageProblem, check_claim, claims_of

    claims = claims_of(docs)
    if not claims:
        return ""
    try:
        classes = cluster.storage_classes()
    except KubeError as exc:
        print(f"kubeddp submit: note: StorageClasses not checked ({exc})", file=sys.stderr)
        return ""
    for claim in claims:
        try:
            print(f"kubeddp submit: checkpoints: {check_claim(claim, classes)}", file=sys.stderr)
        except StorageProblem as exc:
            return str(exc)
    return ""


def _cluster_command(args: argparse.Namespace, command: str) -> int:
    from kubeddp.tools import jobs
    from kubeddp.tools.kube import KubeError

    try:
        cluster = _connect(args)
        if command == "status":
            jobs.status(cluster, args.kind, args.name, sys.stdout, args.output)
        elif command == "logs":
            jobs.logs(
                cluster, args.kind, args.name, args.replica, args.follow, args.tail, sys.stdout
            )
        elif command == "wait":
            return jobs.wait(cluster, args.kind, args.name, args.timeout, args.interval, sys.stdout)
        elif command == "diagnose":
            from kubeddp.tools.diagnosis import diagnose

            return diagnose(cluster, args.kind, args.name, sys.stdout)
        else:
            jobs.delete(cluster, args.kind, args.name, args.delete_pvc, sys.stdout)
    except KubeError as exc:
        return _fail(command, str(exc), exc.exit_code)
    return 0


CLUSTER_HANDLERS = {
    name: (lambda args, name=name: _cluster_command(args, name))
    for name in ("status", "logs", "wait", "delete", "diagnose")
}
