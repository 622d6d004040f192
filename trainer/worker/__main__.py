"""`python -m kubeddp.trainer.worker` (what torchrun's `--module kubeddp.trainer.worker` runs)."""

from kubeddp.trainer.worker.entry import main
from kubeddp.trainer.worker.leave import leave

if __name__ == "__main__":
    leave(main())
