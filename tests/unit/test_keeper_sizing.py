"""What a pod's last send may take, as launch plans it from the grace period the manifests give
(trainer/keeper/sizing.py); the manifests' side is rendered in test_keeper_manifests.py."""

from __future__ import annotations

from kubeddp.trainer.keeper import sizing

GIB = 2**30


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
    assert sizing.final_send_seconds(10 * GIB) > sizing.final_send_seconds(GIB)
    short = {
        "KUBEDDP_CHECKPOINT_KEEPER_SEND_SLACK_SECONDS": "2",
        "KUBEDDP_TERMINATION_GRACE_SECONDS": "1",
    }
    assert sizing.send_seconds(short, 60, False, 0) == 2  # the slack a test makes short
    assert sizing.send_seconds(short, 60, False, 25e6) == 3
    for bad in ("0", "nan", "soon"):
        slack = {**short, "KUBEDDP_CHECKPOINT_KEEPER_SEND_SLACK_SECONDS": bad}
        assert sizing.send_seconds(slack, 60, False, 0) == sizing.SEND_SLACK_SECONDS


def test_keeper_resources() -> None:
    resources = sizing.keeper_resources()
    assert resources["requests"]["memory"] == "256Mi" and resources["limits"]["memory"] == "512Mi"
    assert int(resources["limits"]["cpu"][:-1]) >= int(resources["requests"]["cpu"][:-1]) >= 100
    faster = sizing.keeper_resources(2e9)  # a faster disk takes more CPU to hash it
    assert int(faster["requests"]["cpu"][:-1]) > int(resources["requests"]["cpu"][:-1])
