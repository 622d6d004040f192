"""Bad render options: exit 2 and one line that names the option (and the fix)."""

from __future__ import annotations

import pytest

from kubeddp.tools.cli.main import main

BAD_OPTIONS = [
    (["pytorchjob", "--name", "Bad_Name"], "--name"),
    (["pytorchjob", "--name", "1job"], "--name"),
    (["pytorchjob", "--namespace", "Team"], "--namespace"),
    (["pytorchjob", "--nodes", "0"], "--nodes"),
    (["pytorchjob", "--nodes", "two"], "--nodes"),
    (["pytorchjob", "--nnodes", "0"], "--nnodes"),
    (["pytorchjob", "--nnodes", "1:x"], "--nnodes"),
    (["trainjob", "--nnodes", "2:4"], "--nnodes"),
    (["pytorchjob", "--elastic", "2:4", "--nnodes", "5"], "--nnodes"),
    (["pytorchjob", "--nproc-per-node", "many"], "--nproc-per-node"),
    (["pytorchjob", "--gpus-per-node", "2", "--nproc-per-node", "4"], "--nproc-per-node"),
    (["pytorchjob", "--gpus-per-node", "-1"], "--gpus-per-node"),
    (["pytorchjob", "--elastic", "4"], "--elastic"),
    (["pytorchjob", "--elastic", "4:2"], "--elastic"),
    (["pytorchjob", "--elastic", "0:2"], "--elastic"),
    (["pytorchjob", "--elastic", "2:4", "--nodes", "5"], "--nodes"),
    (["trainjob", "--elastic", "2:4"], "--elastic"),
    (["indexedjob", "--gang", "volcano"], "--gang"),
    (["pytorchjob", "--gang", "yunikorn"], "--gang"),
    (["trainjob", "--priority-class", "high"], "--priority-class"),
    (["trainjob", "--restart-policy", "Never"], "--restart-policy"),
    (["trainjob", "--ttl-seconds-after-finished", "60"], "--ttl-seconds-after-finished"),
    (["trainjob", "--nproc-per-node", "gpu"], "--nproc-per-node"),
    (["indexedjob", "--restart-policy", "Always"], "--restart-policy"),
    (["pytorchjob", "--restart-policy", "Sometimes"], "--restart-policy"),
    (["indexedjob", "--clean-pod-policy", "All"], "--clean-pod-policy"),
    (["pytorchjob", "--clean-pod-policy", "Some"], "--clean-pod-policy"),
    (["pytorchjob", "--cpu", "lots"], "--cpu"),
    (["pytorchjob", "--memory", "16GB"], "--memory"),
    (["pytorchjob", "--shm-size", "1 G"], "--shm-size"),
    (["pytorchjob", "--checkpoint-pvc", "a", "--checkpoint-size", "1Gi"], "--checkpoint-pvc"),
    (
        ["pytorchjob", "--checkpoints-lost-on-retry", "--storage-class", "fast"],
        "--checkpoints-lost-on-retry",  # the message names both values
    ),
    (["pytorchjob", "--checkpoint-pvc", "a", "--checkpoints-lost-on-retry"], "--checkpoint-pvc"),
    (["pytorchjob", "--elastic", "2:3", "--master-replica"], "--master-replica"),
    (["trainjob", "--master-replica"], "--master-replica"),
    (["trainjob", "--image-pull-policy", "IfNotPresent"], "--image-pull-policy"),
    (
        ["pytorchjob", "--checkpoint-size", "1Gi", "--checkpoint-access-mode", "RWX"],
        "--checkpoint-access-mode",
    ),
    (  # one node's volume on three nodes: Multi-Attach for two of them
        [
            "pytorchjob",
            "--nodes",
            "3",
            "--checkpoint-access-mode",
            "ReadWriteOnce",
            "--checkpoint-storage",
            "mount",
        ],
        "--checkpoint-access-mode",
    ),
    (
        [
            "trainjob",
            "--nodes",
            "3",
            "--checkpoint-access-mode",
            "ReadWriteOncePod",
            "--checkpoint-storage",
            "mount",
        ],
        "--checkpoint-access-mode",
    ),
    (["pytorchjob", "--checkpoint-storage", "somewhere"], "--checkpoint-storage"),
    (["pytorchjob", "--set", "checkpoint.dir=ck"], "--set"),  # not where a volume can go
    (["indexedjob", "--set", "checkpoint.dir=/tmp/ck"], "--set"),
    (
        ["pytorchjob", "--set", "checkpoint.dir=/data/ck", "--volume", "claim:ds:/data"],
        "--set",
    ),
    (["pytorchjob", "--env", "NOEQUALS"], "--env"),
    (["pytorchjob", "--env", "1BAD=x"], "--env"),
    (["pytorchjob", "--node-selector", "pool"], "--node-selector"),
    (["pytorchjob", "--tolerations", "{key: a}"], "--tolerations"),
    (["pytorchjob", "--affinity", "[1, 2]"], "--affinity"),
    (["pytorchjob", "--affinity", "{unclosed"], "--affinity"),
    (["pytorchjob", "--podmonitor-label", "release=x"], "--podmonitor-label"),
    (["pytorchjob", "--podmonitor", "--podmonitor-label", "release"], "--podmonitor-label"),
    (["pytorchjob", "--set", "train.no_such_key=1"], "--set"),
    (["pytorchjob", "--set", "notakey"], "--set"),
    (["pytorchjob", "--config", "/nonexistent/train.yaml"], "--config"),
    (["pytorchjob", "--backoff-limit", "-1"], "--backoff-limit"),
    (["pytorchjob", "--image", "has space"], "--image"),
    (["pytorchjob", "--image-pull-policy", "Sometimes"], "--image-pull-policy"),
    (["pytorchjob", "-o", "toml"], "--output"),
    # options that only the chart had before render rendered it
    (["pytorchjob", "--podmonitor", "--podmonitor-interval", "15x"], "--podmonitor-interval"),
    (["pytorchjob", "--podmonitor-interval", "15s"], "--podmonitor-interval"),
    (["pytorchjob", "--dashboard-label", "team=ml"], "--dashboard-label"),
    (["trainjob", "--runtime-kind", "JobSet"], "--runtime-kind"),
    (["trainjob", "--runtime-name", "Torch Runtime"], "--runtime-name"),
    (["pytorchjob", "--elastic", "2:4", "--rdzv-id", "a b"], "--rdzv-id"),
    (
        ["pytorchjob", "--termination-grace-period-seconds", "-1"],
        "--termination-grace-period-seconds",
    ),
    (["pytorchjob", "--gang", "volcano", "--gang-queue", "Research"], "--gang-queue"),
    (["pytorchjob", "--pod-label", "team=a b"], "--pod-label"),
    (["pytorchjob", "--pod-annotation", "=x"], "--pod-annotation"),
    (["pytorchjob", "--extra-env", "[{nam: TOKEN}]"], "--extra-env"),
    (["pytorchjob", "--resources", "{requests: {cpu: lots}}"], "--resources"),
    (["pytorchjob", "--security-context", "{runAsUser: root}"], "--security-context"),
    (["pytorchjob", "--pod-security-context", "[1]"], "--pod-security-context"),
    (["pytorchjob", "--image", "ghcr.io/a/b@sha256:xyz"], "--image"),
    (["pytorchjob", "--service-account", "Bad_Name"], "--service-account"),
    (["pytorchjob", "--service-account-annotation", "a b=c"], "--service-account-annotation"),
    # the trainer's own rules, through --set
    (["pytorchjob", "--set", "workload.name=custom"], "--set"),
    (["pytorchjob", "--set", "train.lr=nan"], "--set"),
    (["pytorchjob", "--set", "metrics.port=70000"], "--set"),
    # an inline value longer than a file name can be is read as YAML, not as a path
    (["pytorchjob", "--affinity", "{" + "a" * 300 + ": 1}"], "--affinity"),
    (["cronjob"], "kind"),
]


@pytest.mark.parametrize(("argv", "option"), BAD_OPTIONS, ids=[" ".join(a) for a, _ in BAD_OPTIONS])
def test_bad_option_exits_2_with_one_line_naming_it(argv, option, capsys):
    with pytest.raises(SystemExit) as raised:
        code = main(["render", *argv, "--validate-against", "offline"])
        raise SystemExit(code)
    out, err = capsys.readouterr()
    assert raised.value.code == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert option in lines[0]


def test_bad_trainer_config_file_is_rejected_before_printing(tmp_path, capsys):
    config = tmp_path / "train.yaml"
    config.write_text("train:\n  lr: fast\n")
    assert (
        main(["render", "pytorchjob", "--config", str(config), "--validate-against", "offline"])
        == 2
    )
    out, err = capsys.readouterr()
    assert out == "" and "--config" in err and "train.lr" in err
