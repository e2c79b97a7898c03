"""What the demo concludes from what it saw: counts, invariants, the table, the JSON."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import cellplane_operator.demo.scene as scene_module
import cellplane_operator.demo.summary as summary_module
from cellplane_operator.demo.scene import (DEDICATED_CELL, LOST_CELL, MOVE_TARGET, NOISY, TENANTS,
                                           manifests, settings_for)
from cellplane_operator.demo.summary import (EXIT_INVARIANT, EXIT_OK, DemoSummary, JobCounts,
                                             MoveOutcome, NoisyShare, RegionLoss, RunningSample,
                                             StepCall, check_invariants, count_jobs,
                                             jobs_run_twice, noisy_share, render_table,
                                             timeline_line)


def _call(submission: str, job: str, step: int, key: str | None = None) -> StepCall:
    return StepCall("t1", submission, job, step, key or f"{job}/{step}")


def test_a_retry_under_the_same_key_is_not_running_twice() -> None:
    calls = [_call("k-1", "j1", 1), _call("k-1", "j1", 1), _call("k-1", "j1", 2)]
    assert jobs_run_twice(calls) == ()


def test_two_jobs_for_one_submission_or_two_keys_for_one_step_is_running_twice() -> None:
    duplicated = [_call("k-1", "j1", 1), _call("k-1", "j2", 1)]
    restarted = [_call("k-2", "j3", 1, "a"), _call("k-2", "j3", 1, "b")]
    assert jobs_run_twice(duplicated + restarted) == ("k-1", "k-2")


def test_the_same_submission_key_of_two_tenants_is_two_submissions() -> None:
    calls = [StepCall("t1", "k-1", "j1", 1, "j1/1"), StepCall("t2", "k-1", "j2", 1, "j2/1")]
    assert jobs_run_twice(calls) == ()


def test_count_jobs_splits_lost_by_the_report() -> None:
    acknowledged = {"j1": "k1", "j2": "k2", "j3": "k3", "j4": "k4"}
    counts = count_jobs(acknowledged=acknowledged, statuses={"j1": "succeeded", "j2": "running"},
                        reported={"j3", "j-unacknowledged"}, calls=[], refused=7)
    assert (counts.accepted, counts.completed, counts.unfinished) == (4, 1, 1)
    assert counts.lost == ("j3", "j4")
    assert counts.lost_in_report == ("j3",)
    assert counts.lost_not_in_report == ("j4",)
    assert counts.refused == 7


def test_noisy_share_takes_the_peak_and_the_mean_share_of_running_jobs() -> None:
    samples = [RunningSample(0.0, {"noisy": 3, "other": 1}),
               RunningSample(0.5, {"noisy": 1, "other": 3}),
               RunningSample(1.0, {})]
    share = noisy_share(samples, tenant="hooli", tenant_id="noisy", cap=3, cell_slots=40)
    assert (share.peak_running, share.samples) == (3, 3)
    assert share.mean_share_of_running == 0.5  # the idle sample has no share
    assert share.cap_share == 3 / 40 and share.peak_share == 3 / 40


def _summary(**changes: object) -> DemoSummary:
    jobs = JobCounts(accepted=100, completed=98, unfinished=1, lost=("j9",),
                     lost_in_report=("j9",), run_twice=(), refused=12)
    move = MoveOutcome("acme", "shared-a1", "shared-b1", "Completed", 0.12, 2.0, 1234, 6.5)
    loss = RegionLoss("region-a", "shared-a1", 6.31, 1, 2, "region-b", 5.9, True, True, 1, 4096)
    noisy = NoisyShare("hooli", cap=3, cell_slots=40, peak_running=3, samples=50,
                       mean_share_of_running=0.6)
    tenants = {"demo/acme": "Ready", "demo/hooli": "Ready"}
    parts: dict[str, object] = dict(jobs=jobs, move=move, region_loss=loss, noisy=noisy,
                                    tenants=tenants)
    parts.update(changes)
    invariants = check_invariants(**parts)  # type: ignore[arg-type]
    return DemoSummary(mode="short", seconds=95.0, invariants=invariants,
                       **parts)  # type: ignore[arg-type]


def test_a_good_run_holds_every_invariant_and_exits_0() -> None:
    summary = _summary()
    assert all(i.held for i in summary.invariants), summary.invariants
    assert summary.exit_code == EXIT_OK


def test_each_broken_invariant_is_named_and_exits_3() -> None:
    base = _summary()
    cases: dict[str, dict[str, object]] = {
        "no acknowledged job lost unless in the report": dict(
            jobs=JobCounts(10, 9, 0, ("j1",), (), ())),
        "nothing run twice": dict(jobs=JobCounts(10, 10, 0, (), (), ("k-3",))),
        "every tenant Ready at the end": dict(tenants={"demo/acme": "Ready",
                                                        "demo/hooli": "Degraded"}),
        "the noisy tenant held within its cap": dict(
            noisy=NoisyShare("hooli", 3, 40, peak_running=4, samples=9,
                             mean_share_of_running=0.9)),
        "the move completed within its write-pause budget": dict(
            move=MoveOutcome("acme", "a", "b", "Completed", 2.5, 2.0)),
        "the lost region's cell served again": dict(
            region_loss=RegionLoss("region-a", "shared-a1", None, 1, 1, "region-a")),
    }
    assert {i.name for i in base.invariants} == set(cases)
    for name, change in cases.items():
        summary = _summary(**change)
        assert [i.name for i in summary.broken] == [name]
        assert summary.exit_code == EXIT_INVARIANT
        table = render_table(summary)
        assert f"invariant: {name}" in table and "BROKEN" in table


def test_no_samples_of_the_noisy_tenant_is_not_proof_it_kept_its_cap() -> None:
    summary = _summary(noisy=NoisyShare("hooli", 3, 40, 0, samples=0, mean_share_of_running=0))
    assert [i.name for i in summary.broken] == ["the noisy tenant held within its cap"]


def test_the_table_has_a_row_per_measure_and_says_every_invariant_held() -> None:
    table = render_table(_summary())
    for needle in ("jobs accepted (acknowledged by a router)", "100", "12 submissions refused",
                   "jobs completed", "1 still queued or running",
                   "1  (1 in the reconciliation report, 0 not)", "jobs run twice",
                   "move acme shared-a1 -> shared-b1", "writes paused 0.120 s (budget 2 s)",
                   "region-a lost: RTO of shared-a1", "6.31 s", "epoch 1 -> 2",
                   "fenced, rebuilt as a standby", "peak 3 of cap 3", "8% of 40 slots",
                   "tenants Ready at the end", "2/2", "every invariant held"):
        assert needle in table, (needle, table)
    lines = table.splitlines()
    assert lines[0] == lines[-2] and set(lines[0]) == {"-"}


def test_the_json_summary_is_one_object_with_what_ci_asserts() -> None:
    document = json.loads(_summary().to_json())
    assert document["exit_code"] == 0 and document["broken"] == []
    assert document["jobs"]["accepted"] == 100
    assert document["jobs"]["lost_not_in_report"] == []
    assert document["move"]["pause_seconds"] == 0.12
    assert document["region_loss"]["rto_seconds"] == 6.31
    assert document["noisy"]["cap_share"] == 0.075
    assert document["tenants"] == {"demo/acme": "Ready", "demo/hooli": "Ready"}
    assert "\n" not in _summary().to_json()


def test_timeline_lines_are_aligned() -> None:
    assert timeline_line(1.25, "hello") == "[demo    1.2s] hello"
    assert timeline_line(123.4, "x") == "[demo  123.4s] x"


def test_the_scene_shows_every_plan_a_dedicated_tenant_and_a_noisy_one() -> None:
    assert {t.plan for t in TENANTS} == {"free", "pro", "enterprise"}
    assert [t.isolation for t in TENANTS].count("dedicated") == 1
    noisy = next(t for t in TENANTS if t.name == NOISY)
    assert noisy.rate > 2 * noisy.quotas["jobsPerSecond"]
    assert noisy.max_running_jobs < max(t.max_running_jobs for t in TENANTS)
    objects = manifests(settings_for(True), "http://127.0.0.1:9/run")
    cells = {o["metadata"]["name"]: o["spec"] for o in objects if o["kind"] == "Cell"}
    assert set(cells) == {LOST_CELL, MOVE_TARGET, DEDICATED_CELL}
    assert cells[DEDICATED_CELL]["tier"] == "dedicated"
    assert all(spec["standbyRegions"] and spec["standbyRegions"][0] != spec["region"]
               for spec in cells.values())
    assert cells[LOST_CELL]["lease"]["durationSeconds"] == 3
    assert "lease" not in manifests(settings_for(False), "http://x/run")[0]["spec"]
    tenants = [o for o in objects if o["kind"] == "Tenant"]
    assert len(tenants) == len(TENANTS)
    noisy_quotas = next(t["spec"]["quotas"] for t in tenants if t["metadata"]["name"] == NOISY)
    assert noisy_quotas["jobsPerSecond"] == settings_for(True).noisy_bucket[0] < noisy.rate
    assert all("targets" in t["spec"] for t in tenants)


def test_the_pure_modules_import_no_io_library() -> None:
    forbidden = {"kopf", "httpx", "psycopg", "psycopg_pool", "aetcd", "fastapi", "uvicorn",
                 "subprocess", "socket"}
    for module in (summary_module, scene_module):
        tree = ast.parse(Path(str(module.__file__)).read_text())
        imported = {alias.name.split(".")[0] for node in ast.walk(tree)
                    if isinstance(node, ast.Import) for alias in node.names}
        imported |= {str(node.module).split(".")[0] for node in ast.walk(tree)
                     if isinstance(node, ast.ImportFrom)}
        assert not imported & forbidden, (module.__name__, imported & forbidden)


def test_a_429_is_retried_after_its_retry_after_capped_at_a_second() -> None:
    import httpx

    from cellplane_operator.demo.load import _retry_after

    def answer(value: str | None) -> httpx.Response:
        return httpx.Response(429, headers={} if value is None else {"Retry-After": value})

    assert _retry_after(answer("0.25")) == 0.25
    assert _retry_after(answer("30")) == 1.0
    assert _retry_after(answer(None)) == 1.0
    assert _retry_after(answer("Wed, 21 Oct 2015 07:28:00 GMT")) == 1.0
    assert _retry_after(answer("-3")) == 0.0
