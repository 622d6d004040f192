"""kubeddp's Trainer and the hand-written loop, alternating in one torchrun job.

Both arms share the processes, the process group and the moment, so this shared machine's
load swings hit them alike; each repeat gives one ratio per arm. Rank 0 writes
`<out>/<arm>-<rep>.json` in the same format as $KUBEDDP_SUMMARY_FILE.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
from pathlib import Path

import torch.distributed as dist

from kubeddp.trainer import constants
from kubeddp.trainer.config import load_config
from kubeddp.trainer.worker.distributed import init_distributed
from kubeddp.trainer.worker.loop import Trainer

sys.path.insert(0, str(Path(__file__).parent))  # torchrun runs this file as a script
import baseline_ddp  # noqa: E402

BASELINE = "baseline"  # the hand-written loop with the AdamW kernel kubeddp picks (fused)


def run_trainer(overrides: list[str], summary: Path, ctx):
    cfg = load_config(None, overrides)
    if ctx is None:
        ctx = init_distributed(cfg.ddp)
    os.environ[constants.ENV_SUMMARY_FILE] = str(summary)
    trainer = Trainer(cfg, ctx)
    try:
        trainer.fit()
    finally:
        trainer.close()
        del trainer
        gc.collect()
    return ctx


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out-dir", required=True)
    p.add_argument("--reps", type=int, required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--base", required=True, help="JSON: overrides every kubeddp arm shares")
    p.add_argument("--arms", required=True, help="JSON: {arm: [overrides]} for kubeddp arms")
    p.add_argument("--baselines", default=json.dumps({BASELINE: "fused"}),
                   help="JSON: {arm: AdamW kernel} for hand-written loop arms")  # fmt: skip
    args = p.parse_args()
    out = Path(args.out_dir)
    base: list[str] = json.loads(args.base)
    arms: dict[str, list[str]] = json.loads(args.arms)
    cfg = load_config(None, base)
    w, t = cfg.workload, cfg.train
    baselines: dict[str, str] = json.loads(args.baselines)
    names = [*baselines, *arms]
    ctx = None
    for rep in range(args.reps):
        order = names[rep % len(names) :] + names[: rep % len(names)]
        for arm in order:
            summary = out / f"{arm}-{rep}.json"
            if arm not in baselines:
                ckpt = f"checkpoint.dir={out / f'{arm}-{rep}-ckpt'}"
                ctx = run_trainer([*base, *arms[arm], ckpt], summary, ctx)
                continue
            if ctx is None:
                ctx = init_distributed(cfg.ddp)
            times, cpu = baseline_ddp.train(
                w, t.batch_size, t.lr, t.seed, args.steps, adamw=baselines[arm]
            )
            if ctx.is_main:
                summary.write_text(
                    json.dumps(
                        {
                            "world_size": ctx.world_size,
                            "samples_per_step": t.batch_size * ctx.world_size,
                            "tokens_per_sample": w.seq_len,
                            "step_end_unix": times,
                            "step_end_cpu": cpu,
                        }
                    )
                )
            dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
