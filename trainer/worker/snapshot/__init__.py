"""In-memory snapshots: the newest training state kept in each pod's memory, restored from a
peer when a pod is lost (issue: a lost pod costs seconds, not an epoch).

Modules (one job each):
  flatten.py  a state dict as a skeleton and its tensors' bytes in one flat buffer, and back
  slots.py    the pod's snapshot directory: two slots, each a data file and a meta written last
  memory.py   whether the pod's memory (cgroup limit, the volume) can hold one more snapshot
  taker.py    taking them while training goes on (background copy, the update waits for it;
              the cadence: a step count, or 1% of the training time, agreed by all ranks)
  restore.py  at start, all ranks agree on the newest state any holds; a peer sends it to the
              pods that lack it; every rank loads it from its pod's memory

`taker.for_worker` makes this rank's taker from checkpoint.* and the environment torchrun gives.
"""
