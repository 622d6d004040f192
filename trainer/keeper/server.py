"""`kubeddp keeper`: the one pod that mounts the checkpoint claim and serves it to the job's pods.

Why: the default StorageClass of EKS, GKE, AKS and kind is ReadWriteOnce, so a claim can be
mounted on one node only. The keeper holds it; every training pod keeps checkpoint.dir on an
emptyDir, fills it from the keeper before its workers start and sends back what its ranks write
(keeper/sync.py). No training pod needs the volume, so they schedule on any node, and a lost
pod loses nothing the keeper already has.

The parts: the protocol (keeper/protocol.py), who may ask (keeper/auth.py: every request signed
with the job's secret), the HTTP side and its limits (keeper/http_handler.py), uploads checked
block by block and committed whole (keeper/uploads.py), and the directory itself (keeper/store.py).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

from kubeddp.trainer import constants, exit_codes
from kubeddp.trainer.arguments import OneLineErrorParser, number
from kubeddp.trainer.keeper.auth import RequestCheck, Secret, SecretError
from kubeddp.trainer.keeper.http_handler import Keeper, KeeperServer, Limits
from kubeddp.trainer.keeper.store import Store
from kubeddp.trainer.keeper.uploads import Uploads

# Directories a keeper must never serve: the whole filesystem, the system's own, and the kernel's
SYSTEM_DIRS = (
    "/", "/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib32", "/lib64", "/opt", "/proc",
    "/root", "/run", "/sbin", "/srv", "/sys", "/tmp", "/usr", "/var", "/var/lib", "/var/run",
)  # fmt: skip
KERNEL_TREES = ("/proc", "/sys", "/dev")
LOG_EVERY_SECONDS = 10.0


class KeeperDirError(ValueError):
    pass


def check_dir(text: str) -> Path:
    """The directory to serve, or KeeperDirError: empty, `/`, a system directory or one under
    /proc, /sys or /dev are refused (a keeper there would hand out the node's files)."""
    if not text.strip():
        raise KeeperDirError("--dir is empty; give the directory the claim is mounted at")
    resolved = os.path.realpath(text)
    under_kernel = any(resolved == t or resolved.startswith(t + "/") for t in KERNEL_TREES)
    if resolved in SYSTEM_DIRS or under_kernel:
        raise KeeperDirError(
            f"--dir {text} ({resolved}) is a system directory; mount the checkpoint claim at a "
            f"directory of its own (e.g. {constants.CHECKPOINT_DIR}) and give that"
        )
    return Path(resolved)


class ThrottledLog:
    """Refusals to stderr, at most one line per LOG_EVERY_SECONDS (a flood of unsigned
    requests must not flood the pod's log); the count left out is said with the next line."""

    def __init__(self) -> None:
        self.last = 0.0
        self.dropped = 0
        self.lock = threading.Lock()

    def __call__(self, line: str) -> None:
        with self.lock:
            now = time.monotonic()
            if now - self.last < LOG_EVERY_SECONDS:
                self.dropped += 1
                return
            more = f" ({self.dropped} more since the last line)" if self.dropped else ""
            self.last, self.dropped = now, 0
        print(line + more, file=sys.stderr, flush=True)


def serve(
    root: Path,
    host: str,
    port: int,
    secret: Secret | None = None,
    keep: int | None = None,
    limits: Limits | None = None,
) -> KeeperServer:
    store = Store(root, keep)
    store.prepare()
    keeper = Keeper(store, Uploads(store), RequestCheck(secret) if secret else None,
                    limits or Limits())  # fmt: skip
    return KeeperServer((host, port), keeper, ThrottledLog())


def keeper_parser() -> OneLineErrorParser:
    p = OneLineErrorParser(
        prog="kubeddp keeper",
        description="serve a checkpoint directory (the claim mounted in this pod) to the "
        "training pods of a job",
    )
    p.add_argument("--dir", default=constants.CHECKPOINT_DIR, help="the directory to serve")
    p.add_argument("--port", type=number(int, 1, high=65535), default=constants.KEEPER_PORT)
    p.add_argument("--bind", default="0.0.0.0", help="address to listen on")
    p.add_argument(
        "--token-file",
        help="the job's keeper secret: a file (the mounted Secret; default "
        f"${constants.ENV_CHECKPOINT_KEEPER_TOKEN_FILE}); without one, requests are not "
        "authenticated",
    )
    p.add_argument(
        "--keep",
        type=number(int, 1, high=1_000_000),
        default=None,
        help="checkpoints kept (the job's checkpoint.keep; default: what each upload says)",
    )
    p.add_argument("--idle-seconds", type=number(float, 0.1, high=3600), default=60.0,
                   help="a connection silent this long is closed")  # fmt: skip
    p.add_argument("--max-connections", type=number(int, 1, high=100_000), default=128)
    p.add_argument("--max-client-connections", type=number(int, 1, high=100_000), default=16,
                   help="connections from one address (a pod)")  # fmt: skip
    p.add_argument("--max-requests", type=number(int, 1, high=10_000), default=32)
    return p


def keeper_main(argv: list[str]) -> int:
    args = keeper_parser().parse_args(argv)
    try:
        root = check_dir(args.dir)
        token = args.token_file or os.environ.get(constants.ENV_CHECKPOINT_KEEPER_TOKEN_FILE)
        secret = Secret.from_file(token) if token else None
    except (KeeperDirError, SecretError) as exc:
        print(f"kubeddp keeper: error: {exc}", file=sys.stderr)
        return exit_codes.BAD_INPUT
    limits = Limits(idle_seconds=args.idle_seconds, max_connections=args.max_connections,
                    max_requests=args.max_requests,
                    max_client_connections=args.max_client_connections)  # fmt: skip
    try:
        server = serve(root, args.bind, args.port, secret, args.keep, limits)
    except OSError as exc:
        print(
            f"kubeddp keeper: error: cannot serve {root} on port {args.port} "
            f"({exc.strerror or exc}); check that the claim is mounted there and writable by "
            "this user",
            file=sys.stderr,
        )
        return exit_codes.BAD_INPUT
    how = (
        "every request signed with the job's secret"
        if secret
        else "WITHOUT authentication: anyone who reaches this port may read and replace "
        f"checkpoints (set {constants.ENV_CHECKPOINT_KEEPER_TOKEN_FILE})"
    )
    keep = f", keeping {args.keep} checkpoints" if args.keep else ""
    print(f"[kubeddp] keeper: serving {root} on port {args.port}{keep}; {how}",
          file=sys.stderr, flush=True)  # fmt: skip
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


def main(argv: list[str] | None = None) -> int:
    return keeper_main(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    raise SystemExit(main())
