"""One training process (what torchrun starts `nproc_per_node` times per node)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from kubeddp.trainer import constants
from kubeddp.trainer.config import ConfigError, load_config


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="kubeddp worker", description="one DDP training process")
    p.add_argument(
        "--config",
        default=os.environ.get(constants.ENV_CONFIG) or None,
        help="trainer YAML config (default: $KUBEDDP_CONFIG)",
    )
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override one config value (repeatable)",
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    rank = int(os.environ.get("RANK", "0"))
    try:
        cfg = load_config(args.config, args.overrides)
    except ConfigError as exc:
        print(f"kubeddp: error: {exc}", file=sys.stderr)
        return 2
    # Imported after the config is known good: torch takes a second or two to import.
    from kubeddp.trainer.checkpoint import CheckpointError
    from kubeddp.trainer.distributed import DistributedSetupError, init_distributed, teardown
    from kubeddp.trainer.loop import Trainer
    from kubeddp.trainer.preemption import Preempted

    try:
        ctx = init_distributed(cfg.ddp)
    except DistributedSetupError as exc:
        print(f"kubeddp: error: {exc}", file=sys.stderr)
        return 2
    if ctx.is_main:
        print("[kubeddp] effective config:\n" + cfg.to_yaml(), flush=True)
        try:
            Path(cfg.checkpoint.dir).mkdir(parents=True, exist_ok=True)
            (Path(cfg.checkpoint.dir) / "config.yaml").write_text(cfg.to_yaml())
        except OSError as exc:
            print(
                f"[kubeddp] warning: cannot write {cfg.checkpoint.dir}/config.yaml: {exc.strerror}",
                flush=True,
            )
    code = 0
    try:
        trainer = Trainer(cfg, ctx, source=os.environ.get("KUBEDDP_RDZV_SOURCE", "standalone"))
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
    if code == constants.PREEMPTED_EXIT_CODE:
        # Peers may already be gone; skip the teardown barrier and exit at once.
        os._exit(code)
    teardown(barrier=code == 0)
    if rank == 0 and code == 0:
        print("[kubeddp] finished", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
