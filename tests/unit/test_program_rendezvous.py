"""Which rendezvous a user's init_process_group call uses (trainer/worker/program_rendezvous.py):
only a call on the agent store's port keeps torchrun's shared store; a tcp:// address or a
MASTER_PORT of the program's own gets a store served by the program's rank 0. The runs are in
tests/integration/test_tutorial_scripts.py (tcp_init.py, snapshot_outside.py)."""

from __future__ import annotations

import inspect
import subprocess
import sys

import pytest

from kubeddp.trainer.worker.program_rendezvous import store_port

ENV = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29511"}
PORTS = {
    "env:// default": ((None, None, ENV), "29511"),
    "env:// given": (("env://", None, ENV), "29511"),
    "a port the program set": ((None, None, {**ENV, "MASTER_PORT": "12355"}), "12355"),
    "tcp://": (("tcp://127.0.0.1:23456", None, ENV), "23456"),
    "tcp:// without a port": (("tcp://127.0.0.1", None, ENV), None),
    "a bad tcp:// port": (("tcp://127.0.0.1:99999", None, ENV), None),
    "file://": (("file:///tmp/init", None, ENV), None),
    "a store given": ((None, object(), ENV), None),
}


@pytest.mark.parametrize("case", PORTS)
def test_store_port(case: str) -> None:
    (init_method, store, env), port = PORTS[case]
    assert store_port(init_method, store, env) == port


def test_the_wrapper_keeps_torchs_signature_and_only_under_a_shared_store() -> None:
    """Installed where torchrun shares its store, and the program sees init_process_group as
    torch defines it; elsewhere nothing is touched."""
    probe = (
        "import inspect, os\n"
        "from kubeddp.trainer.worker import program_rendezvous\n"
        "program_rendezvous.install()\n"
        "import torch.distributed as dist\n"
        "from torch.distributed import distributed_c10d as c10d\n"
        "print(dist.init_process_group is c10d.init_process_group,\n"
        "      dist.init_process_group.__code__.co_filename.endswith('program_rendezvous.py'),\n"
        "      inspect.signature(dist.init_process_group))\n"
    )
    out = {}
    for shared in ("True", "False"):
        env = {"TORCHELASTIC_USE_AGENT_STORE": shared, "MASTER_PORT": "1", "PATH": "/usr/bin"}
        done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                              env=env, timeout=120)  # fmt: skip
        assert done.returncode == 0, done.stderr
        out[shared] = done.stdout.split(" ", 2)
    from torch.distributed import init_process_group

    assert out["True"][:2] == ["True", "True"] and out["False"][:2] == ["True", "False"]
    assert out["True"][2].strip() == str(inspect.signature(init_process_group))
