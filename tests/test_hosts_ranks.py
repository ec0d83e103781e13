"""Hosts, ranks and stragglers: one machine is one node, a job of many ranks reads as one job.

The trials are written by the multi-rank generator (dashboard.synthetic.write_job); every
expected number is computed here from the events it wrote."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import dashboard
from dashboard.analysis import ranks
from dashboard.analysis.compat import PandasFrame
from dashboard.synthetic import write_job, write_trial

from tests.conftest import ROOT, upload_folder

SLOW_RANK = 5  # on algo-2, the second of 2 hosts x 4 ranks


@pytest.fixture(scope="module")
def slow_rank_job(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("slow_rank"))
    return folder, write_job(folder, hosts=2, ranks_per_host=4, steps=60, slow_rank=SLOW_RANK, seed=1)


def test_a_single_host_trial_has_one_node(tmp_path):
    write_trial(str(tmp_path), hosts=1)
    trial = dashboard.load_trial(str(tmp_path))
    assert trial.nodes == ["algo-1"]
    [process] = trial.processes
    assert process.node == "algo-1" and process.id.endswith("-algo-1") and process.rank is None
    assert set(trial.framework["node"].astype(str)) == set(trial.system["node"].astype(str)) == {"algo-1"}


@pytest.mark.parametrize("record_ranks", [True, False], ids=["ranks-recorded", "ranks-from-node-ids"])
def test_ranks_are_listed_under_their_hosts(tmp_path, record_ranks):
    job = write_job(str(tmp_path), hosts=2, ranks_per_host=4, steps=10, record_ranks=record_ranks)
    trial = dashboard.load_trial(str(tmp_path))
    assert trial.nodes == ["algo-1", "algo-2"]
    expected = sorted({(f"algo-{e.node.rsplit('-', 1)[1]}", e.rank, e.pid, e.node) for e in job.events})
    assert [(p.node, p.rank, p.pid, p.id) for p in trial.processes] == expected
    local = [p.local_rank for p in trial.processes]
    assert local == ([0, 1, 2, 3] * 2 if record_ranks else [None] * 8)
    # every event carries its host and rank
    fw = trial.framework
    by_id = {e.node: e.rank for e in job.events}
    assert (fw["rank"].to_numpy() == fw["process"].astype(str).map(by_id).to_numpy()).all()


def test_the_straggler_is_the_slow_rank_and_the_heatmap_agrees(slow_rank_job):
    folder, job = slow_rank_job
    result = dashboard.analyze(folder)
    stragglers = [r for r in result.recommendations if r.id.startswith("straggler")]
    assert [(r.id, r.evidence["rank"], r.evidence["node"]) for r in stragglers] == [
        ("straggler_rank", SLOW_RANK, "algo-2")]
    # its share and the others' median, from the events
    share = {}
    for rank in range(8):
        mine = [e for e in job.events if e.rank == rank]
        wait = sum(e.duration_us for e in mine if e.kind == "getnext")
        train = sum(e.duration_us for e in mine if e.kind in ("getnext", "step"))
        share[rank] = 100 * wait / train
    evidence = stragglers[0].evidence
    assert evidence["wait_percent"] == pytest.approx(share[SLOW_RANK], abs=0.6)
    others = sorted(v for r, v in share.items() if r != SLOW_RANK)
    assert evidence["others_median_percent"] == pytest.approx(float(np.median(others)), abs=0.6)

    # The heat map's hottest cell, computed here by overlapping every GetNext with every bucket.
    heat = ranks.heatmap(ranks.rank_waits(result.trial.framework), buckets=40)
    edges = heat.edges_us
    brute = np.zeros((8, len(edges) - 1))
    for e in job.events:
        if e.kind == "getnext":
            for b in range(len(edges) - 1):
                brute[e.rank, b] += max(0, min(e.end_us, edges[b + 1]) - max(e.start_us, edges[b]))
    brute /= np.diff(edges)
    assert [p.rank for p in heat.processes] == list(range(8))  # by host, then rank
    np.testing.assert_allclose(heat.share, brute, atol=1e-9)
    row, bucket = heat.hottest
    assert heat.processes[row].rank == SLOW_RANK == int(np.argmax(brute.max(axis=1)))
    assert bucket == int(np.argmax(brute[SLOW_RANK]))
    assert heat.labels[row] == "algo-2 · rank 5"
    by_wait = ranks.heatmap(ranks.rank_waits(result.trial.framework), buckets=40, order="wait")
    assert by_wait.processes[0].rank == SLOW_RANK


def test_a_host_with_slow_storage_is_the_straggler_with_its_io_beside_it(tmp_path):
    write_job(str(tmp_path), hosts=3, ranks_per_host=2, steps=40, slow_storage_host=2, seed=2)
    result = dashboard.analyze(str(tmp_path))
    stragglers = [r for r in result.recommendations if r.id.startswith("straggler")]
    assert [(r.id, r.evidence["node"]) for r in stragglers] == [("straggler_host", "algo-2")]
    evidence = stragglers[0].evidence
    assert evidence["processes"] == ["2-algo-2", "3-algo-2"]
    assert evidence["iowait_percent"] == pytest.approx(35.0) and evidence["others_iowait_percent"] == pytest.approx(0.5)
    assert "I/O wait 35 %" in stragglers[0].text
    # per-host verdicts: the slow host's share is its own ranks' wait over their training
    assert set(result.nodes_verdict) == {"algo-1", "algo-2", "algo-3"}
    assert result.nodes_verdict["algo-2"].input_percent > 2 * result.nodes_verdict["algo-1"].input_percent


def test_no_straggler_in_an_even_job(tmp_path):
    write_job(str(tmp_path), hosts=2, ranks_per_host=4, steps=40, seed=3)
    result = dashboard.analyze(str(tmp_path))
    assert not [r for r in result.recommendations if r.id.startswith("straggler")]


def _app(*args):
    return subprocess.run([sys.executable, os.path.join(ROOT, "app.py"), *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=120)


def test_cli_lists_hosts_and_processes_and_scopes_by_host_and_rank(slow_rank_job):
    folder, job = slow_rank_job
    done = _app("analyze", folder, "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["nodes"] == ["algo-1", "algo-2"]
    assert data["processes"] == [{"node": f"algo-{1 + r // 4}", "pid": 30_000 + 10 * r, "rank": r,
                                  "local_rank": r % 4, "id": f"{r}-algo-{1 + r // 4}"} for r in range(8)]
    slow = [e for e in job.events if e.kind == "getnext" and e.rank == SLOW_RANK]
    outliers = data["getnext"]["outliers"]
    assert outliers and all((o["node"], o["rank"], o["pid"]) == ("algo-2", SLOW_RANK, slow[0].pid) for o in outliers)
    host = json.loads(_app("analyze", folder, "--json", "--node", "algo-2").stdout)
    assert host["getnext"]["count"] == sum(1 for e in job.events if e.kind == "getnext" and e.rank >= 4)
    assert [p["rank"] for p in host["processes"]] == [4, 5, 6, 7]
    one = json.loads(_app("analyze", folder, "--json", "--rank", str(SLOW_RANK)).stdout)
    assert one["getnext"]["count"] == len(slow)
    assert [p["id"] for p in one["processes"]] == ["5-algo-2"] and list(one["processes_verdict"]) == ["5-algo-2"]
    assert one["nodes"] == ["algo-2"]  # its host's system metrics come with it
    text = _app("analyze", folder).stdout
    assert "rank 5 (pid 30050) on algo-2" in text and "    rank 5:" in text


def test_host_and_rank_survive_s3_and_the_compatibility_api(slow_rank_job, s3_client):
    folder, job = slow_rank_job
    upload_folder(s3_client, folder, "ranks-bucket", "job/profiler")
    remote = dashboard.load_trial("s3://ranks-bucket/job/profiler", s3_client=s3_client)
    local = dashboard.load_trial(folder)
    assert [(p.node, p.rank, p.id) for p in remote.processes] == [(p.node, p.rank, p.id) for p in local.processes]
    assert remote.framework[["node", "process", "rank"]].astype(str).equals(
        local.framework[["node", "process", "rank"]].astype(str))
    frame = PandasFrame(folder)
    # The reference's node ids: the framework frames name the process, the system frame the host.
    framework = frame.get_all_framework_metrics()
    assert set(framework["nodeID"]) == {e.node for e in job.events}
    assert set(frame.get_all_dataloader_metrics()["node_id"]) == {e.node for e in job.events}
    assert set(frame.get_all_system_metrics()["nodeID"]) == {"algo-1", "algo-2"}
