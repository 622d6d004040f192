"""The example user script (examples/ddp_train.py) as the tests run it, and what it prints.

Every run of the script with the same world size must end with the same parameters, whatever
launched it (torchrun, kubeddp train, an emulated operator, two namespaces): the tests compare
the digest the script prints at the end (`parameters sha256 ...`, from rank 0).
"""

from __future__ import annotations

import functools
import re
import sys
import tempfile
from pathlib import Path

from tests.helpers import procs

EXAMPLES = procs.REPO / "examples"
SCRIPT = EXAMPLES / "ddp_train.py"
LAUNCH_ERA_SCRIPT = EXAMPLES / "launch_era_train.py"
# Small and quick: 512 rows, batch 16 per rank, 2 epochs.
ARGS = ["--samples", "512", "--epochs", "2", "--batch-size", "16"]
DIGEST = re.compile(r"done: (\d+) steps, parameters sha256 ([0-9a-f]{16})")
RUN_SECONDS = 180


def digest(output: str) -> str:
    found = DIGEST.findall(output)
    assert len(found) == 1, f"expected one final digest line, found {found}\n{output[-3000:]}"
    return found[0][1]


@functools.cache
def torchrun_digest(nproc: int) -> str:
    """The digest of a direct `torchrun --standalone` run of the script with `nproc` workers."""
    with tempfile.TemporaryDirectory(prefix="kubeddp-torchrun-") as tmp:
        argv = [
            sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={nproc}", str(SCRIPT), *ARGS,
            "--snapshot", str(Path(tmp) / "snapshot.pt"),
        ]  # fmt: skip
        done = procs.run(argv, Path(tmp) / "torchrun.log", RUN_SECONDS)
        assert done.code == 0, done.output[-3000:]
        return digest(done.output)
