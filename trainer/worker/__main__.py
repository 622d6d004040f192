"""`python -m kubeddp.trainer.worker` (what torchrun's `--module kubeddp.trainer.worker` runs)."""

import sys

from kubeddp.trainer.worker.entry import main

if __name__ == "__main__":
    sys.exit(main())
