"""Where a job's checkpoints live: the rules, written once for the chart and the trainer.

The trainer reads them here; `make chart` writes them into the chart's templates/_constants.tpl
(`storage`), and templates/_storage.tpl decides from that copy alone. So the two agree on:
- which checkpoint.dir names object storage (`SCHEME:...`, the schemes of OBJECT_STORES) and
  which a directory: the trainer picks the backend by it and keeps its own records (retry
  budget, finished run, stall reports) only in a directory; the chart then mounts no claim;
- where the checkpoints volume is mounted in a pod: at checkpoint.dir, or at POD_DIR as
  scratch space when the checkpoints are in object storage;
- which checkpoint.dir a pod may have: an absolute, clean path (VOLUME_DIR), not on, over or
  under RESERVED (the pod's other mounts, the keeper's secret among them, and the image's own
  paths; the chart's `volumes` schema keeps a user's mounts off them too);
- the kinds of storage a pod gets, in the order the chart decides: the object store its
  checkpoint.dir names; EMPTY_DIR (checkpoints.lostOnRetry); then a claim, reached as
  CLAIM_STORAGES say (checkpoints.storage; unset: KEEPER when several pods share a claim that
  is not ReadWriteMany, else MOUNT). A pod learns the keeper from its env
  (constants.ENV_CHECKPOINT_KEEPER), which the chart sets only then.
tests/unit/test_storage_rules.py changes a rule here and sees the chart and the trainer follow.
"""

from __future__ import annotations

import posixpath

from kubeddp.trainer import constants

# Rank 0's TensorBoard curves beside the checkpoints (worker/curves.py); checkpoint.dir's
# safety check counts it among kubeddp's own names (worker/checkpoint/storage.py).
TENSORBOARD_DIR = "tensorboard"

# checkpoint.dir `SCHEME://...` -> (the backend: `module:Class` with `from_url(text)`, what it
# is: the chart's one line about the job's storage)
OBJECT_STORES: dict[str, tuple[str, str]] = {
    "s3": (
        "kubeddp.trainer.worker.checkpoint.s3:S3Storage",
        "S3-compatible object storage (credentials from the pod's env, e.g. --env-from "
        "secret:NAME, or its cloud role; the image needs kubeddp[s3])",
    ),
}
POD_DIR = constants.CHECKPOINT_DIR  # checkpoint.dir in a pod unless set
# checkpoint.dir on a volume: absolute and clean, as the volume is mounted exactly there (RE2)
VOLUME_DIR = r"^(/[A-Za-z0-9._@+-]+)+$"
SHM_DIR = "/dev/shm"  # a memory emptyDir in every pod
CONFIG_DIR = posixpath.dirname(constants.CONFIG_FILE)
# The image's own paths (the venv with Python and kubeddp, the system, the user entry the
# processes run as): a volume mounted on or above one would hide it.
IMAGE_PATHS = (
    "/opt/venv", "/usr", "/bin", "/sbin", "/lib", "/lib64", "/etc/passwd", "/etc/group",
    "/proc", "/sys", "/dev",
)  # fmt: skip
RESERVED = (SHM_DIR, CONFIG_DIR, constants.SCRATCH_DIR, constants.KEEPER_TOKEN_DIR, *IMAGE_PATHS)
KEEPER, MOUNT, EMPTY_DIR = "keeper", "mount", "emptyDir"
CLAIM_STORAGES = (KEEPER, MOUNT)  # checkpoints.storage: how the pods reach the claim


def object_store(location: str) -> str:
    """The scheme of the object store `location` names ('s3'), '' for a directory. Any case
    and form counts (`S3:/bucket`): the backend then says what is wrong with the URL."""
    scheme, colon, _ = str(location).partition(":")
    return scheme.lower() if colon and scheme.lower() in OBJECT_STORES else ""


def is_directory(location: str) -> bool:
    """Whether checkpoints at `location` are files in a directory (kubeddp's own records can
    go beside them), not objects in a store."""
    return not object_store(location)


def constants_for_chart() -> dict:
    """The rules as the chart reads them (`storage` in templates/_constants.tpl)."""
    return {
        "objectStores": {scheme: what for scheme, (_, what) in OBJECT_STORES.items()},
        "podDir": POD_DIR,
        "volumeDir": VOLUME_DIR,
        "reserved": list(RESERVED),
        "keeper": KEEPER,
        "mount": MOUNT,
        "emptyDir": EMPTY_DIR,
    }
