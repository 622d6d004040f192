"""Operate kubeddp jobs from Python (a notebook, a pipeline): the `kubeddp` command line's
render, validate, submit, status, wait, logs, delete and diagnose, one to one.

    from kubeddp.client import Client, KubeddpError

    with Client(namespace="team") as cluster:            # kubeconfig as kubectl chooses it
        cluster.submit("pytorchjob", name="demo", nnodes=2, gpus_per_node=8,
                       set={"train.epochs": 3})
        print(cluster.status("demo"))                     # what `kubeddp status demo` prints
        for line in cluster.logs("demo", follow=True):    # until the job ends
            print(line)
        end = cluster.wait("demo", timeout="2h")          # end.state: Succeeded | Failed

Options are those of the command line, named as in Python (`--gpus-per-node` ->
`gpus_per_node`; the kind is the first argument). The same checks run, through the same
transports (the `kubernetes` client when installed, else `kubectl proxy`), and a failure is a
`KubeddpError` whose message is the one line the command prints and whose `exit_code` is the
command's (docs/exit-codes.md). Notes and warnings go to `say` (stderr by default).
docs/python-api.md has a walk-through.

Importing this module imports neither torch nor the Kubernetes client. (`kubeddp.api` is the
other Python API: what a training script calls while it runs under kubeddp.)
"""

from kubeddp.tools.cli.client import (
    Client,
    JobEnd,
    JobStatus,
    KubeddpError,
    LogLine,
    Manifests,
    Validated,
    WaitTimeout,
)

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
