"""How each tutorial-style script of tests/tutorial_scripts runs: the command line its tutorial
(../shared/tutorials) teaches, with `torchrun` or `python` replaced by `kubeddp train`, and the
line a finished run prints. tests/integration/test_tutorial_scripts.py runs each under `kubeddp
train`, tests/emulation/test_emulated_tutorials.py in a one-pod PyTorchJob."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[1] / "tutorial_scripts"
SCRIPT = "{script}"  # where the script's path goes in a command line


@dataclass(frozen=True)
class TutorialRun:
    taught: str  # the tutorial's own command line
    train: tuple[str, ...]  # kubeddp train's, SCRIPT for the script's path
    done: str  # a regex that a finished run prints
    pod: bool = True  # also run in an emulated pod (False: see `why`)
    why: str = ""
    own_tmp: bool = False  # it writes a fixed path under /tmp: give it a /tmp of its own

    @property
    def program_args(self) -> list[str]:
        """The program's own arguments (what follows the script word)."""
        return list(self.train[self.train.index(SCRIPT) + 1 :])

    def train_argv(self, script: Path) -> list[str]:
        return [str(script) if word == SCRIPT else word for word in self.train]


RUNS: dict[str, TutorialRun] = {
    "accumulate_amp.py": TutorialRun(
        "torchrun --nproc_per_node=2 accumulate_amp.py",
        ("--nproc_per_node=2", SCRIPT), r"\[\{'rank': 0, 'loss': [-0-9.e]+\}, \{'rank': 1"),
    "launch_era.py": TutorialRun(
        "python -m torch.distributed.launch --nproc_per_node 2 launch_era.py --epochs 2",
        ("--nproc_per_node", "2", SCRIPT, "--local_rank=${local_rank}", "--epochs", "2"),
        r"done: 2 epochs on 2 workers"),
    "mp_process_collectives.py": TutorialRun(
        "python mp_process_collectives.py", (SCRIPT,), r"Rank 1 has data 1.0 and sum 1.0"),
    "no_sampler.py": TutorialRun(
        "torchrun --nproc_per_node=2 no_sampler.py", ("--nproc_per_node=2", SCRIPT),
        r"worker 1 done"),
    "no_set_epoch.py": TutorialRun(
        "torchrun --nproc_per_node=2 no_set_epoch.py", ("--nproc_per_node=2", SCRIPT),
        r"done: 10 epochs, saved model.pt", pod=False,
        why="its DataLoader workers share tensors over an AF_UNIX socket under TMPDIR, which in "
        "an emulated pod is a host path longer than such a socket takes (a pod's is /tmp)"),
    "snapshot_outside.py": TutorialRun(
        "torchrun --standalone --nproc_per_node=2 snapshot_outside.py",
        ("--standalone", "--nproc_per_node=2", SCRIPT), r"done: 5 epochs", pod=False,
        own_tmp=True,
        why="it writes /tmp/snapshot.pt, which for an emulated pod is the test machine's own "
        "(the emulator maps mounts in arguments and config only)"),
    "spawn_multigpu.py": TutorialRun(
        "python spawn_multigpu.py 4 2", (SCRIPT, "4", "2", "--snapshot", "snapshot.pt"),
        r"done: 4 epochs on 2 workers"),
    "tcp_init.py": TutorialRun(
        "torchrun --nproc_per_node=2 tcp_init.py", ("--nproc_per_node=2", SCRIPT), r"finished"),
    "torchrun_snapshot.py": TutorialRun(
        "torchrun --standalone --nproc_per_node=2 torchrun_snapshot.py 50 10",
        ("--standalone", "--nproc_per_node=2", SCRIPT, "50", "10"),
        r"Epoch 40 \| Training snapshot saved at snapshot.pt"),
}  # fmt: skip
# Scripts that are not run, and why (each script is in RUNS or here).
NOT_RUN = {
    "nccl_file_init.py": "NCCL on GPUs only, and its two pitfalls (a file:// store on a shared "
    "filesystem, NCCL on a CPU tensor) are what `kubeddp check` must find in it",
}
