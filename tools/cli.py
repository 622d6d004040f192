"""The `kubeddp` command line: `launch`/`train` run training; the rest handle manifests.

Heavy imports (torch, kubernetes) happen inside each subcommand so `kubeddp --help` is instant.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "launch":
        from kubeddp.trainer.launch import launch_main

        return launch_main(argv[1:])
    if argv and argv[0] == "train":
        from kubeddp.trainer.launch import train_main

        return train_main(argv[1:])
    print("usage: kubeddp {launch,train} ...", file=sys.stderr)
    return 2
