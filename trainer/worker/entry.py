"""One training process: its config, distributed init, the Trainer, teardown, the exit code.

Started by `kubeddp launch`, a worker takes the config launch loaded (passed in its
environment); started by a user's own torchrun, it reads --config/--set itself.
"""

from __future__ import annotations

import os
import sys

from kubeddp.trainer import exit_codes
from kubeddp.trainer.arguments import OneLineErrorParser
from kubeddp.trainer.config import (
    Config,
    ConfigError,
    add_config_options,
    load_config_options,
    resolved_config,
)
from kubeddp.trainer.worker.parent_death import die_with_launcher


def main(argv: list[str] | None = None) -> int:
    die_with_launcher()  # first: a launcher killed from now on takes this worker with it
    parser = OneLineErrorParser(prog="kubeddp worker", description="one DDP training process")
    add_config_options(parser)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        cfg = resolved_config(os.environ) or load_config_options(args, os.environ)
    except ConfigError as exc:
        print(f"kubeddp: error: {exc}", file=sys.stderr)
        return 2
    try:
        return run(cfg)
    except KeyboardInterrupt:  # Ctrl-C outside the training loop (which saves and exits 130)
        print("[kubeddp] interrupted", file=sys.stderr, flush=True)
        os._exit(exit_codes.INTERRUPTED)  # peers may be gone: no teardown


def run(cfg: Config) -> int:
    """Train with `cfg` in this process; the exit code (143 after a preemption save, 130 after
    Ctrl-C)."""
    die_with_launcher()
    rank = int(os.environ.get("RANK", "0"))
    # Imported after the config is known good: torch takes a second or two to import.
    from kubeddp.trainer.worker.checkpoint import CheckpointError
    from kubeddp.trainer.worker.distributed import (
        DistributedSetupError,
        init_distributed,
        teardown,
    )
    from kubeddp.trainer.worker.loop import Trainer
    from kubeddp.trainer.worker.preemption import Preempted

    try:
        ctx = init_distributed(cfg.ddp)
    except DistributedSetupError as exc:
        print(f"kubeddp: error: {exc}", file=sys.stderr)
        return 2
    if ctx.is_main:  # the checkpoint manager copies it next to the checkpoints
        print("[kubeddp] effective config:\n" + cfg.to_yaml(), flush=True)
    code = 0
    try:
        trainer = Trainer(cfg, ctx)
    except ValueError as exc:  # ConfigError/WorkloadError: a corpus or factory that is wrong
        print(f"kubeddp: error (rank {rank}): {exc}", file=sys.stderr, flush=True)
        teardown(barrier=False)
        return 2
    try:
        code = trainer.fit()
    except Preempted as exc:
        code = int(exc.code)
    except (CheckpointError, ValueError) as exc:
        print(f"kubeddp: error (rank {rank}): {exc}", file=sys.stderr, flush=True)
        code = 2
    finally:
        trainer.close()
        del trainer
    if code in (exit_codes.PREEMPTED, exit_codes.INTERRUPTED):
        # Peers may already be gone; skip the teardown barrier and exit at once.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    teardown(barrier=code == 0)
    if rank == 0 and code == 0:
        print("[kubeddp] finished", flush=True)
    return code
