"""How the keeper and a pod's last send follow the checkpoint's size and the grace period: the
pure functions launch uses and the manifests are to use (trainer/keeper/sizing.py)."""

from __future__ import annotations

from kubeddp.trainer.keeper import sizing

GIB = 2**30


def test_the_grace_period_grows_with_the_checkpoint_and_leaves_its_send_room() -> None:
    small, large = (sizing.termination_grace_seconds(60, n * GIB) for n in (1, 10))
    assert small < large
    for size in (0, GIB, 10 * GIB):
        grace = sizing.termination_grace_seconds(60, size)
        assert sizing.send_after_signal_seconds(grace, 60) >= sizing.final_send_seconds(size)


def test_the_last_send_after_sigterm_is_what_the_grace_leaves() -> None:
    env = {"KUBEDDP_TERMINATION_GRACE_SECONDS": "300"}
    assert sizing.send_seconds(env, 60, signalled=True, pending_bytes=GIB) == 300 - 60 - 10 - 5
    assert sizing.send_seconds({}, 60, True, 0) == 120 - 60 - 10 - 5  # the manifests' default
    assert sizing.send_seconds({}, 200, True, 0) == 5  # never nothing
    for bad in ("nan", "-3", "soon"):
        assert sizing.send_seconds({"KUBEDDP_TERMINATION_GRACE_SECONDS": bad}, 60, True, 0) == 45


def test_a_finished_pods_last_send_follows_what_is_pending() -> None:
    assert sizing.send_seconds({}, 60, False, 0) == 120  # at least the grace
    big = sizing.send_seconds({}, 60, False, 20 * GIB)
    assert big == sizing.final_send_seconds(20 * GIB) > 120


def test_keeper_resources_and_the_empty_dir_size() -> None:
    resources = sizing.keeper_resources(4 * GIB)
    assert resources["requests"]["memory"] == "256Mi" and resources["limits"]["memory"] == "512Mi"
    assert int(resources["limits"]["cpu"][:-1]) >= int(resources["requests"]["cpu"][:-1]) >= 100
    assert sizing.empty_dir_size_limit(4 * GIB, 3) == f"{(5 * 4 * 1024) + 1024}Mi"
