"""torchrun's options, written once here so that `kubeddp train --help` and launch's parsing
never import torch (about 2 s): tests/unit/test_torchrun_args.py checks this table against the
installed torch's own parser (torch.distributed.run.get_args_parser), and the workflow's
torch-range job runs that check on the oldest and the newest torch kubeddp supports.

Each option that kubeddp passes on to torchrun's agent as it is has a row: its spellings, whether
it takes a value (and which choices), and the first torch release that has it (read from each
release's torch/distributed/run.py). A row's flag given with an older torch is refused in one
line before anything starts. The options kubeddp decides itself (the rendezvous, the node and
worker counts, the program) are in DECIDED, under the same names; NOT_TAKEN are torchrun's
options that make no sense through kubeddp.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TorchrunFlag:
    options: tuple[str, ...]  # a short one first, as torchrun lists them; the dashed long next
    dest: str
    help: str  # kubeddp's words; `torchrun --help` has torch's
    takes_value: bool = True
    choices: tuple[str, ...] | None = None
    kind: type = str  # what the value must read as (torch's parser type)
    since: tuple[int, int] = (2, 4)  # the first torch minor whose torchrun has it
    metavar: str | None = None

    @property
    def name(self) -> str:
        """The long, dashed spelling: how kubeddp passes it on."""
        return next(option for option in self.options if option.startswith("--"))


def _both(name: str) -> tuple[str, str]:
    """`--log-dir` -> ("--log-dir", "--log_dir"): torchrun takes both spellings."""
    return name, "--" + name[2:].replace("-", "_")


PASSED_ON: tuple[TorchrunFlag, ...] = (
    TorchrunFlag(_both("--rdzv-conf"), "rdzv_conf", "extra rendezvous settings, KEY=VALUE,...",
                 metavar="KEY=VALUE,..."),
    TorchrunFlag(_both("--monitor-interval"), "monitor_interval",
                 "seconds between the agent's looks at its workers", kind=float,
                 metavar="SECONDS"),
    TorchrunFlag(_both("--start-method"), "start_method", "how the agent starts workers",
                 choices=("spawn", "fork", "forkserver")),
    TorchrunFlag(_both("--event-log-handler"), "event_log_handler",
                 "the name of a registered torchelastic event handler", since=(2, 8),
                 metavar="NAME"),
    TorchrunFlag(("--role",), "role", "the workers' role name", metavar="ROLE"),
    TorchrunFlag(_both("--no-python"), "no_python",
                 "run the program as an executable, not with python", takes_value=False),
    TorchrunFlag(_both("--run-path"), "run_path",
                 "torchrun runs the script with runpy.run_path in the worker's interpreter; "
                 "kubeddp's runner always does", takes_value=False),
    TorchrunFlag(_both("--log-dir"), "log_dir", "base directory of the workers' log files",
                 metavar="DIR"),
    TorchrunFlag(("-r", "--redirects"), "redirects",
                 "send workers' stdout/stderr to files in --log-dir: 0-3, or RANK:0-3,...",
                 metavar="STD"),
    TorchrunFlag(("-t", "--tee"), "tee", "as --redirects, and to the console too",
                 metavar="STD"),
    TorchrunFlag(_both("--local-ranks-filter"), "local_ranks_filter",
                 "show only these local ranks' output on the console: 0,1,...", metavar="RANKS"),
    TorchrunFlag(_both("--duplicate-stdout-filters"), "duplicate_stdout_filters",
                 "copy stdout lines that match any of these words to a file", since=(2, 10),
                 metavar="WORD,..."),
    TorchrunFlag(_both("--duplicate-stderr-filters"), "duplicate_stderr_filters",
                 "copy stderr lines that match any of these words to a file", since=(2, 10),
                 metavar="WORD,..."),
    TorchrunFlag(_both("--local-addr"), "local_addr", "this node's address for the rendezvous",
                 metavar="ADDR"),
    TorchrunFlag(_both("--logs-specs"), "logs_specs",
                 "a torchrun.logs_specs entry point that places the log files", metavar="NAME"),
    TorchrunFlag(_both("--numa-binding"), "numa_binding",
                 "bind each worker to the CPUs near its GPU", since=(2, 9),
                 choices=("node", "socket", "exclusive", "core-complex")),
    TorchrunFlag(_both("--signals-to-handle"), "signals_to_handle",
                 "signals the agent forwards to its workers: SIGTERM,SIGINT,...", since=(2, 10),
                 metavar="SIGNALS"),
    TorchrunFlag(_both("--virtual-local-rank"), "virtual_local_rank",
                 "every worker sees LOCAL_RANK 0 and its own GPU as device 0", since=(2, 10),
                 takes_value=False),
    TorchrunFlag(_both("--shutdown-timeout"), "shutdown_timeout",
                 "seconds the agent waits for workers to stop before SIGKILL", kind=int,
                 since=(2, 12), metavar="SECONDS"),
    TorchrunFlag(_both("--log-line-prefix-template"), "log_line_prefix_template",
                 "the prefix of each console line, e.g. '${rank}: '", since=(2, 14),
                 metavar="TEMPLATE"),
)  # fmt: skip
# torchrun's options kubeddp decides from the plan, or takes under its own names (launch.py).
DECIDED = frozenset({
    "help", "nnodes", "nproc_per_node", "rdzv_backend", "rdzv_endpoint", "rdzv_id",
    "standalone", "max_restarts", "node_rank", "master_addr", "master_port", "module",
})  # fmt: skip
# torchrun's own shell completion (torch 2.14): `kubeddp completion` completes kubeddp.
NOT_TAKEN = frozenset({"print_completion"})
# Accepted with torchrun's meaning, done by kubeddp rather than passed on: --no-python (the
# runner executes the program itself) and --run-path (the runner always runs a script with
# runpy.run_path in the worker's interpreter; torchrun would run our runner that way).
DONE_HERE = frozenset({"no_python", "run_path"})
BY_DEST = {flag.dest: flag for flag in PASSED_ON}
