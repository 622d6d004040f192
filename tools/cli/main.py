"""The `kubeddp` command line: `launch`/`train` run training; the rest handle manifests, clusters.

The manifest and cluster commands are a thin layer over the Python API (tools/cli/client.py,
published as kubeddp.client): parse the options, call, print; a KubeddpError is its one line
and exit code. Heavy imports (torch, the Kubernetes client) happen inside each subcommand so
`kubeddp --help` is instant.
"""

from __future__ import annotations

import argparse
import os
import sys

from kubeddp.trainer import __version__, exit_codes
from kubeddp.trainer.arguments import OneLineErrorParser, duration, number

EXIT_BAD_INPUT = exit_codes.BAD_INPUT
DEBUG_ENV = "KUBEDDP_DEBUG"  # =1: an internal error shows its traceback


def main(argv: list[str] | None = None) -> int:
    """Every command ends with a code of trainer/exit_codes.py: Ctrl-C is INTERRUPTED, and
    anything unexpected is one INTERNAL_ERROR line (KUBEDDP_DEBUG=1 shows the traceback)."""
    if argv is None:  # the `kubeddp` command itself: launch's last moments ignore SIGTERM
        from kubeddp.trainer.launcher import end_signals

        end_signals.PROCESS_ENDS_WITH_LAUNCH = True
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[0] if argv and not argv[0].startswith("-") else "kubeddp"
    from kubeddp.tools.cli.output import OutputError, checked_stdout

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
    started = sys.modules.get("kubeddp.tools.cluster.kubectl_proxy")
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
        from kubeddp.trainer.keeper.server import keeper_main

        return keeper_main(argv[1:])
    if argv and argv[0] == "check":
        return cmd_check(argv[1:])
    args = parse_command(argv)
    if not getattr(args, "handler", None):
        build_parser().print_usage(sys.stderr)
        return EXIT_BAD_INPUT
    from kubeddp.tools.cli.client_errors import KubeddpError

    try:
        return args.handler(args)
    except KubeddpError as exc:
        from kubeddp.tools.cli.output import say

        for line in exc.done:  # what it did before it failed (created, deleted)
            print(line)
        for line in exc.cli_lines():
            say(line)
        return exc.exit_code


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


def build_parser() -> argparse.ArgumentParser:
    from kubeddp.tools.manifests.chart.render_options import add_render_options
    from kubeddp.tools.manifests.kinds import KINDS

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
    validate.add_argument("files", nargs="*", metavar="FILE", help="YAML/JSON files, - = stdin")
    validate.add_argument(
        "-f",
        "--filename",
        dest="filenames",
        action="append",
        default=[],
        metavar="FILE",
        help="a file to check, as submit -f and kubectl take it (repeatable)",
    )
    _add_schema_source(validate)
    _add_cluster_options(validate, with_namespace=False)
    validate.set_defaults(handler=cmd_validate)

    submit = sub.add_parser("submit", help="validate and create a job (a file or render options)")
    add_render_options(submit)
    submit.add_argument("-f", "--filename", help="submit this manifest file (- = stdin)")
    submit.add_argument("--dry-run", choices=("none", "client", "server"), default="none")
    _add_schema_source(submit)
    _add_cluster_options(submit, with_namespace=False)
    submit.set_defaults(handler=cmd_submit)

    completion = sub.add_parser("completion", help="print a shell completion script")
    completion.add_argument("shell", choices=("bash", "zsh", "fish"))
    completion.set_defaults(handler=cmd_completion)

    for name, help_text in (
        ("status", "state, progress, conditions, replica counts, pod restarts"),
        ("logs", "logs of the job's pods"),
        ("wait", "wait until Succeeded (exit 0) or Failed (exit 1)"),
        ("delete", "delete the job and its ConfigMap/Service/PodMonitor"),
        ("diagnose", "the stall reports in the job's pod logs (see docs/diagnostics.md)"),
    ):
        cmd = sub.add_parser(name, help=help_text)
        cmd.add_argument("name", metavar="NAME")  # checked by the API, before any request
        cmd.add_argument(
            "--kind",
            choices=list(KINDS),
            default=None,
            help="the job's kind (default: the kind that has a job of this name)",
        )
        _add_cluster_options(cmd, with_namespace=True)
        cmd.set_defaults(handler=CLUSTER_HANDLERS[name])
    sub.choices["status"].add_argument(
        "-o", "--output", choices=("text", "json", "yaml"), default="text"
    )
    logs = sub.choices["logs"]
    logs.add_argument("--replica", help="pytorchjob: master|worker; else an index")
    logs.add_argument(
        "--node-rank",
        type=number(int, 0),
        metavar="N",
        help="only the pod of node rank N (PET_NODE_RANK; a PyTorchJob's Master is 0)",
    )
    logs.add_argument(
        "-f",
        "--follow",
        action="store_true",
        help="follow the job until it ends: pods that are recreated join, ended ones stop",
    )
    logs.add_argument("--tail", type=number(int, 0), help="last N lines per pod")
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
    """`kubeddp check [--nnodes N] SCRIPT [-- ARGS]`: every finding, one line each (file:line:
    pitfall|advice rule: what; fix); 0 no pitfall (advice is shown), 1 pitfalls, 2 a script
    that cannot be read."""
    from kubeddp.trainer.script_check.checks import ScriptCheckError, check_file, pitfalls

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
        "--nnodes",
        "--nodes",
        type=nodes_count,
        default=1,
        metavar="N|MIN:MAX",
        help="nodes the job runs on, as torchrun's --nnodes (default 1)",
    )
    args = parser.parse_args(own)
    try:
        findings = check_file(args.script, args.nnodes, program_args)
    except ScriptCheckError as exc:
        return _fail("check", str(exc))
    for finding in findings:
        print(finding.shown(args.script))
    return exit_codes.TRAINING_FAILED if pitfalls(findings) else exit_codes.OK


def nodes_count(text: str) -> int:
    """An argparse type for --nnodes: N, or MIN:MAX (the most nodes the job may run on)."""
    return int(number(int, 1)(text.rsplit(":", 1)[-1] if text.count(":") == 1 else text))


def _add_schema_source(parser: argparse.ArgumentParser) -> None:
    from kubeddp.tools.cli.client import SCHEMA_SOURCES

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
        type=duration(1),
        default=None,
        metavar="DURATION",
        help="how long one API call may wait for an answer: seconds, or 30s, 2m (default 30s)",
    )
    if with_namespace:
        group.add_argument("-n", "--namespace")  # checked by the API, before any request


def _fail(command: str, message: str, code: int = EXIT_BAD_INPUT) -> int:
    from kubeddp.tools.cli.output import say

    say(f"kubeddp {command}: error: {message}")
    return code


def _client(args: argparse.Namespace):  # noqa: ANN202 - tools.client.Client, imported late
    from kubeddp.tools.cli.client import Client

    return Client(
        args.kubeconfig, args.context, getattr(args, "namespace", None), args.request_timeout
    )


def _render_options(args: argparse.Namespace) -> dict:
    """The render options given on the command line, as kubeddp.client takes them (an option
    given by its old name under that keyword, so that its errors name it as given)."""
    from kubeddp.tools.cli.render_call import ALIASES, OPTIONS

    spelled = getattr(args, "spelled", None) or {}
    keyword = {name: spelled[name].lstrip("-").replace("-", "_") for name in spelled}
    return {
        keyword[name] if keyword.get(name) in ALIASES else name: getattr(args, name)
        for name in OPTIONS
        if getattr(args, name) is not None
    }


def cmd_render(args: argparse.Namespace) -> int:
    manifests = _client(args).render(
        args.kind,
        validate_against=args.validate_against,
        program_args=args.program_args,
        **_render_options(args),
    )
    sys.stdout.write(manifests.yaml() if args.output == "yaml" else manifests.json())
    return 0


def cmd_completion(args: argparse.Namespace) -> int:
    from kubeddp.tools.cli.completion import script

    sys.stdout.write(script(args.shell, build_parser()))
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    """Exit 0: valid; 1: problems found (printed on stdout); 2: a file that cannot be read
    or is not YAML objects; 3: --validate-against cluster and the cluster cannot be used."""
    files = [*args.files, *args.filenames]
    if not files:
        return _fail("validate", "no file given; name the manifests: kubeddp validate FILE... "
                     "or -f FILE (- reads stdin)")  # fmt: skip
    checked = _client(args).validate(*files, validate_against=args.validate_against)
    for problem in checked.problems:
        print(problem)
    if checked.problems:
        print(
            f"kubeddp validate: error: {len(checked.problems)} problem(s) in "
            f"{checked.documents} documents (listed above); fix them and validate again",
            file=sys.stderr,
        )
        return exit_codes.TRAINING_FAILED  # the table's "validate: problems found"
    print(f"ok: {checked.documents} documents in {checked.files} files", file=sys.stderr)
    return 0


def cmd_submit(args: argparse.Namespace) -> int:
    lines = _client(args).submit(
        args.kind,
        filename=args.filename,
        dry_run=args.dry_run,
        validate_against=args.validate_against,
        program_args=args.program_args,
        **_render_options(args),
    )
    for line in lines:
        sys.stdout.write(line if line.endswith("\n") else f"{line}\n")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    import json

    import yaml

    report = _client(args).status(args.name, args.kind)
    if args.output == "json":
        sys.stdout.write(json.dumps(dict(report), indent=2) + "\n")
    elif args.output == "yaml":
        sys.stdout.write(yaml.safe_dump(dict(report), sort_keys=False))
    else:
        print(report)
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    lines = _client(args).logs(
        args.name,
        args.kind,
        replica=args.replica,
        node_rank=args.node_rank,
        follow=args.follow,
        tail=args.tail,
    )
    for line in lines:
        print(line, flush=args.follow)
    return 0


def cmd_wait(args: argparse.Namespace) -> int:
    from kubeddp.tools.cli.client import WaitTimeout

    try:
        end = _client(args).wait(args.name, args.kind, args.timeout, args.interval)
    except WaitTimeout as exc:  # not an error of the command: the answer "not yet"
        print(exc)
        return exc.exit_code
    print(end)
    return exit_codes.OK if end.succeeded else exit_codes.TRAINING_FAILED


def cmd_delete(args: argparse.Namespace) -> int:
    for line in _client(args).delete(args.name, args.kind, delete_pvc=args.delete_pvc):
        print(line)
    return 0


def cmd_diagnose(args: argparse.Namespace) -> int:
    """Print every stall report in the job's pod logs; 1 when there is none."""
    reports = _client(args).diagnose(args.name, args.kind)
    for report in reports:
        print(report)
    if not reports:
        print(NO_REPORTS.format(name=args.name))
        return exit_codes.TRAINING_FAILED
    return 0


NO_REPORTS = (
    "no stall report in the logs of {name}'s pods (a restarted container's earlier log is "
    "gone; the reports stay in diagnostics.report_dir, by default .kubeddp-diagnostics/ in "
    "the checkpoint volume)"
)
CLUSTER_HANDLERS = {
    "status": cmd_status,
    "logs": cmd_logs,
    "wait": cmd_wait,
    "delete": cmd_delete,
    "diagnose": cmd_diagnose,
}
