"""checkpoint.dir: s3://... with real processes against a real S3-compatible server on
127.0.0.1: a 2-process gloo run killed with SIGKILL and started again resumes bit-exactly; a
corrupt object is set aside; bad URL, credentials, bucket or endpoint end before training with
one line and the documented exit code."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from kubeddp.trainer import exit_codes
from kubeddp.trainer.worker import checkpoint as ckpt
from tests.helpers import checkpoints as ck
from tests.helpers import procs, s3_faults, s3server, workloads
from tests.helpers.ports import free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
RUN = "resume/run"
URL = f"s3://{s3server.BUCKET}/{RUN}"


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("s3-resume")


@pytest.fixture(scope="module")
def server(work: Path) -> Iterator[s3server.S3Server]:
    with s3server.started(work) as running:
        yield running


def _newest_state(server: s3server.S3Server, monkeypatch: pytest.MonkeyPatch) -> dict:
    for name, value in server.env().items():
        monkeypatch.setenv(name, value)
    found = ckpt.load_newest_valid(URL, log=lambda _m: None)
    assert found is not None
    return found[1]


def test_killed_run_started_again_resumes_bit_exactly(
    work: Path, server: s3server.S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    baseline = ck.baseline_state(work)
    # 10 ms per sample: ~70 steps last ~10 s, so the kill lands mid-run.
    slow = procs.child_env({**server.env(), workloads.DELAY_ENV: "0.01"})
    marker = f"{RUN}/ckpt-{2 * ck.SAVE_EVERY:08d}/COMPLETE"
    with procs.started(ck.scenario_argv(URL), work / "killed.log", slow) as run:
        procs.wait_until(lambda: marker in server.keys(RUN), 120, "the 2nd checkpoint", run)
        assert run.poll() is None, "the run ended before it could be killed"
        run.kill()  # SIGKILL, the launcher and both workers: a pod deleted at once
    done = procs.run(ck.scenario_argv(URL), work / "again.log", 150, procs.child_env(server.env()))
    assert done.code == 0, done.output[-4000:]
    assert f"resumed from {URL}/ckpt-" in done.output, done.output[-4000:]
    final = _newest_state(server, monkeypatch)
    assert final["step"] == ck.STEPS_2_RANKS
    ck.assert_each_sample_once(final, ck.TRAIN_ROWS, ck.EPOCHS)
    ck.assert_same_parameters(final, baseline)


def test_corrupt_newest_object_is_set_aside_and_the_previous_resumed(
    work: Path, server: s3server.S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    baseline = ck.baseline_state(work)
    if not server.keys(f"{RUN}/ckpt-{ck.STEPS_2_RANKS:08d}/COMPLETE"):
        pytest.skip("needs the finished run of the test before")
    client = server.client()
    newest = f"{RUN}/ckpt-{ck.STEPS_2_RANKS:08d}"
    data = client.get_object(Bucket=s3server.BUCKET, Key=f"{newest}/state.pt")["Body"].read()
    client.put_object(Bucket=s3server.BUCKET, Key=f"{newest}/state.pt", Body=data[:1000])
    done = procs.run(
        ck.scenario_argv(URL), work / "corrupt.log", 150, procs.child_env(server.env())
    )
    assert done.code == 0, done.output[-4000:]
    assert f"checkpoint s3://{s3server.BUCKET}/{newest} is unreadable" in done.output
    kept = f"kept the bad checkpoint for inspection as s3://{s3server.BUCKET}/{newest}.bad"
    assert kept in done.output, done.output[-4000:]
    assert server.keys(f"{newest}.bad/"), "the bad checkpoint is kept"
    final = _newest_state(server, monkeypatch)
    ck.assert_same_parameters(final, baseline)


def _one_process(url: str) -> list[str]:
    return procs.kubeddp_argv(
        "train", "--nproc", "1",
        "--set", "workload.name=regression",
        "--set", "train.max_steps=3",
        "--set", f"checkpoint.dir={url}",
        "--set", "metrics.enabled=false",
    )  # fmt: skip


@pytest.mark.parametrize(
    ("url", "env_change", "code", "message"),
    [
        ("s3://Bad_Bucket/x", {}, exit_codes.BAD_INPUT, "is not a valid s3:// URL"),
        (URL, {"AWS_ACCESS_KEY_ID": None}, exit_codes.BAD_INPUT, "no S3 credentials"),
        ("s3://no-such-bucket-here/x", {}, exit_codes.BAD_INPUT, "create the bucket"),
        (URL, {"AWS_ENDPOINT_URL": "closed"}, exit_codes.STORAGE_UNREACHABLE, "cannot be reached"),
    ],
    ids=["bad-url", "no-credentials", "no-bucket", "unreachable"],
)
def test_bad_storage_ends_before_training_in_one_line(
    work: Path,
    server: s3server.S3Server,
    url: str,
    env_change: dict[str, str | None],
    code: int,
    message: str,
) -> None:
    env = procs.child_env(server.env())
    for name, value in env_change.items():
        if value is None:
            env.pop(name)
        else:  # a port nothing listens on
            env[name] = f"http://127.0.0.1:{free_port()}"
    name = "-".join(env_change) or url.rsplit("/", 2)[-2]
    done = procs.run(_one_process(url), work / f"bad-{name}.log", 120, env)
    assert done.code == code, done.output[-4000:]
    errors = [line for line in done.output.splitlines() if message in line]
    # a malformed URL is refused by launch, before any worker; the rest by the workers
    assert errors and errors[0].startswith(("kubeddp: error", "kubeddp train: error")), errors
    assert "Traceback" not in done.output
    assert "step 1/" not in done.output, "the check comes before training"
    assert not os.path.exists(Path(procs.REPO) / "s3:"), "never a local directory named s3:"


def test_an_endpoint_that_stores_uploads_short_never_finishes_a_run_or_loses_one(
    work: Path, server: s3server.S3Server
) -> None:
    """The endpoint stores half of each checkpoint upload and answers 200: the run whose saves
    it takes does not end "finished" (0) but retryable (202), nothing it wrote counts as a
    checkpoint, and the next run resumes from the last good one, not from step 0."""
    url = f"s3://{s3server.BUCKET}/lying/run"

    def argv(steps: int) -> list[str]:
        # no in-memory snapshots: the run after the lying one would resume from memory (step 9),
        # newer than anything on S3; what S3 kept is what this test reads
        return [*_one_process(url), "--set", f"train.max_steps={steps}", "--set",
                "checkpoint.every_steps=2", "--set", "checkpoint.async_save=false",
                "--set", "checkpoint.memory_snapshots=false"]  # fmt: skip

    good = procs.child_env(server.env())
    done = procs.run(argv(6), work / "lying-first.log", 150, good)
    assert done.code == 0, done.output[-4000:]
    lying_env = {**server.env(), "AWS_REQUEST_CHECKSUM_CALCULATION": "when_required"}
    with s3_faults.started(work, "short", server.endpoint) as endpoint:
        lying = procs.child_env({**lying_env, "AWS_ENDPOINT_URL": endpoint})
        done = procs.run(argv(10), work / "lying-short.log", 150, lying)
    assert done.code == exit_codes.STORAGE_UNREACHABLE, done.output[-4000:]
    assert "and answered 200; the save is not kept" in done.output
    assert "[kubeddp] finished" not in done.output
    assert not server.keys("lying/run/ckpt-00000010/"), "nothing of the lying saves is kept"
    done = procs.run(argv(10), work / "lying-after.log", 150, good)
    assert done.code == 0, done.output[-4000:]
    assert f"resumed from {url}/ckpt-00000006 (step 6" in done.output, done.output[-4000:]
