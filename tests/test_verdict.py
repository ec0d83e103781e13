"""Verdict and recommendations on trials with planted problems.

Trials are written in the reference format with the collector's own writers, with every
duration chosen here, so each expected number is computed in the test from what was
planted. Real torch.profiler runs are in test_verdict_kineto.py.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from dataclasses import dataclass, field

import pytest

import dashboard
from dashboard import format as fmt
from dashboard.analysis import diagnosis as v
from dashboard.analysis.diagnosis.findings import storage
from dashboard.collector.writer import SystemMetricsWriter, TraceWriter
from dashboard.report import to_dict, to_text
from tests.conftest import ROOT

START_US = 1_795_986_600_000_000
MAIN_PID = 4242
MP, SP = "_MultiProcessingDataLoaderIter", "_SingleProcessDataLoaderIter"
SAMPLE_US = 100_000  # system metrics every 100 ms


@dataclass
class Planted:
    folder: str
    getnext: list = field(default_factory=list)  # (epoch, batch, worker, start_us, end_us)
    steps: list = field(default_factory=list)  # (epoch, start_us, end_us)
    inits: list = field(default_factory=list)  # (start_us, end_us)
    end_us: int = 0

    def windows(self) -> list[tuple[int, int]]:
        """Training windows: per epoch, first GetNext start to the end of the last step."""
        out = []
        for epoch in sorted({e for e, *_ in self.getnext}):
            first = min(s for e, _, _, s, _ in self.getnext if e == epoch)
            last = max(end for e, _, end in self.steps if e == epoch)
            out.append((first, last))
        return out

    def input_percent(self) -> float:
        wait = sum(e - s for *_, s, e in self.getnext)
        return 100.0 * wait / sum(e - s for s, e in self.windows())


def plant(folder, *, epochs=1, batches=40, num_workers=2, persistent=True, cls=MP, init_us=30_000,
          first_us=2_000, getnext_us=lambda epoch, batch, worker: 500, step_us=50_000,
          pin_memory=True, host=1, cpu_percent=40.0, cores=4, iowait=lambda t_us: 0.5, gpus=0,
          fetch_us=None, fetch_ready_us=0, system=True, init_args=None) -> Planted:
    """A one-process training job: per epoch an init (unless persistent after the first),
    then GetNext + train step per batch, batch b served by worker b mod num_workers; each
    fetch (fetch_us, when given) ends fetch_ready_us before its GetNext ends. init_args: more
    arguments of each init (settings the collector records, e.g. prefetch_factor), over the
    others."""
    node = fmt.framework_node_id(MAIN_PID, host)
    writer = TraceWriter(folder, node, start_time_us=START_US, rotate_s=3600)
    planted = Planted(folder)
    t = START_US
    for epoch in range(epochs):
        if epoch == 0 or not persistent:
            writer.complete(fmt.PHASE_INIT, fmt.init_event_name(cls), t, t + init_us,
                            {fmt.ARG_PID: MAIN_PID, fmt.ARG_NUM_WORKERS: num_workers,
                             fmt.ARG_PIN_MEMORY: pin_memory, fmt.ARG_STEP: "-1", **(init_args or {})})
            planted.inits.append((t, t + init_us))
            t += init_us
        for batch in range(batches):
            worker = batch % num_workers if num_workers else -1
            duration = first_us if batch == 0 and (epoch == 0 or not persistent) else \
                getnext_us(epoch, batch, worker)
            writer.complete(fmt.PHASE_ITER, fmt.getnext_event_name(cls), t, t + duration,
                            {fmt.ARG_PID: MAIN_PID, fmt.ARG_WORKER_ID: worker, fmt.ARG_STEP: str(batch)})
            planted.getnext.append((epoch, batch, worker, t, t + duration))
            if fetch_us is not None:
                fetch = fetch_us(batch, worker)
                end = t + duration - fetch_ready_us
                writer.complete(fmt.PHASE_WORKER_FETCH, f"{cls}.fetch", end - fetch, end,
                                {fmt.ARG_PID: MAIN_PID + 1 + worker, fmt.ARG_WORKER_ID: worker})
            t += duration
            writer.complete(fmt.PHASE_STEP_TRAIN, fmt.PHASE_STEP_TRAIN, t, t + step_us,
                            {fmt.ARG_PID: MAIN_PID, fmt.ARG_STEP: str(batch)})
            planted.steps.append((epoch, t, t + step_us))
            t += step_us
        t += 100_000  # between epochs
    writer.close()
    planted.end_us = t
    if system:
        metrics = SystemMetricsWriter(folder, fmt.system_node_id(host), rotate_s=60)
        ts = START_US
        while ts <= t + SAMPLE_US:
            records = []
            for cpu in range(cores):
                records.append(("cpu", f"cpu{cpu}", "CPUUtilization", cpu_percent, ts / 1e6))
                records.append(("cpu", f"cpu{cpu}", "I/OWaitPercentage", iowait(ts), ts / 1e6))
            for gpu in range(gpus):
                records.append(("gpu", f"gpu{gpu}", "GPUUtilization", 60.0, ts / 1e6))
            metrics.write(records)
            ts += SAMPLE_US
        metrics.close()
    return planted


def findings(folder) -> dict[str, v.Recommendation]:
    result = dashboard.analyze(folder)
    items = {r.id: r for r in result.recommendations}
    assert len(items) == len(result.recommendations), "one finding per kind"
    return items


def test_clean_job_gets_no_findings_and_its_exact_verdict(tmp_path):
    planted = plant(str(tmp_path), gpus=1, pin_memory=True)
    result = dashboard.analyze(str(tmp_path))
    assert result.recommendations == []
    expected = planted.input_percent()  # 39 x 0.5 ms + 2 ms over 40 x ~50 ms
    assert expected < 5
    assert result.verdict.input_percent == pytest.approx(expected, abs=0.01)
    assert result.verdict.class_ == "not"
    process = fmt.framework_node_id(MAIN_PID, 1)
    assert set(result.nodes_verdict) == {"algo-1"}  # by host
    assert set(result.processes_verdict) == {process}
    assert result.nodes_verdict["algo-1"].input_percent == result.verdict.input_percent
    assert result.processes_verdict[process].input_percent == result.verdict.input_percent
    assert "training steps" in result.verdict.basis


@pytest.mark.parametrize("getnext_us, step_us, cls", [(30_000, 30_000, "highly"),
                                                       (5_000, 50_000, "moderately"),
                                                       (2_000, 50_000, "not")])
def test_verdict_classes_follow_the_thresholds(tmp_path, getnext_us, step_us, cls):
    planted = plant(str(tmp_path), getnext_us=lambda *_: getnext_us, first_us=getnext_us,
                    step_us=step_us, cpu_percent=97.0)
    result = dashboard.analyze(str(tmp_path))
    expected = 100.0 * getnext_us / (getnext_us + step_us)
    assert planted.input_percent() == pytest.approx(expected)
    assert result.verdict.input_percent == pytest.approx(expected, abs=0.01)
    assert result.verdict.class_ == cls


def test_workers_recreated_every_epoch_recommend_persistent_workers(tmp_path):
    init_us, first_us, steady_us = 400_000, 600_000, 1_000
    plant(str(tmp_path), epochs=3, batches=20, persistent=False, init_us=init_us, first_us=first_us,
          getnext_us=lambda *_: steady_us, step_us=30_000)
    result = dashboard.analyze(str(tmp_path))
    items = {r.id: r for r in result.recommendations}
    found = items["persistent_workers"]
    # The first batch of each start waits for the new workers, beyond a steady batch's wait.
    startup_s = (first_us - steady_us) / 1e6
    [budget] = result.budget
    assert budget.parts["startup"] == pytest.approx(3 * startup_s, abs=1e-6)
    assert budget.largest == "startup"
    assert found.evidence["starts_total"] == 3 and found.evidence["num_workers"] == 2
    assert found.evidence["startup_s"] == pytest.approx(startup_s)
    assert found.evidence["init_median_s"] == pytest.approx(init_us / 1e6)
    # Persistent workers start once: the two later starts' waits are what it saves.
    assert found.change == {"persistent_workers": True}
    assert found.saving_s == pytest.approx((3 - 1) * startup_s, abs=1e-3)
    assert found.predicted["training_s"] == pytest.approx(budget.training_s - found.saving_s, abs=1e-3)
    assert "persistent_workers=True" in found.text
    # Each start, from its initialization to the end of its first batch.
    epoch_us = init_us + first_us + 19 * steady_us + 20 * 30_000 + 100_000
    assert [(w["start_us"], w["end_us"]) for w in found.evidence["starts"]] == [
        (START_US + e * epoch_us, START_US + e * epoch_us + init_us + first_us) for e in range(3)]
    # one finding for the one part: start-up; no worker-count advice
    assert set(items) == {"persistent_workers"}


def test_persistent_workers_recorded_get_no_persistent_finding(tmp_path):
    # The collector records persistent_workers on every iter(): a loader that already has
    # them is never told to set them, however its epochs start.
    from dashboard.collector.writer import TraceWriter

    folder = str(tmp_path)
    node = fmt.framework_node_id(MAIN_PID, 1)
    writer = TraceWriter(folder, node, start_time_us=START_US, rotate_s=3600)
    t = START_US
    for epoch in range(3):
        writer.complete(fmt.PHASE_INIT, fmt.init_event_name(MP), t, t + 1_000,
                        {fmt.ARG_PID: MAIN_PID, fmt.ARG_NUM_WORKERS: 2, fmt.ARG_PIN_MEMORY: False,
                         fmt.ARG_PERSISTENT: True, fmt.ARG_PREFETCH: 2, fmt.ARG_ITERATOR_ID: epoch + 1})
        t += 1_000
        for batch in range(20):
            duration = 300_000 if batch == 0 else 500
            writer.complete(fmt.PHASE_ITER, fmt.getnext_event_name(MP), t, t + duration,
                            {fmt.ARG_PID: MAIN_PID, fmt.ARG_WORKER_ID: batch % 2, fmt.ARG_ITERATOR_ID: epoch + 1})
            t += duration + 20_000
    writer.close()
    result = dashboard.analyze(folder)
    [budget] = result.budget
    assert budget.evidence["persistent_workers"] is True
    assert budget.parts["startup"] == pytest.approx(3 * (0.3 - 0.0005), abs=1e-6)
    assert "persistent_workers" not in {r.id for r in result.recommendations}


def test_one_slow_worker_is_named_with_its_batches(tmp_path):
    slow, fast = 80_000, 1_000
    planted = plant(str(tmp_path), batches=60, num_workers=4, step_us=20_000, cores=8, cpu_percent=30.0,
                    getnext_us=lambda epoch, batch, worker: slow if worker == 2 else fast)
    result = dashboard.analyze(str(tmp_path))
    items = {r.id: r for r in result.recommendations}
    assert set(items) == {"slow_worker"}
    found = items["slow_worker"]
    theirs = [(b, s, e) for _, b, w, s, e in planted.getnext if w == 2]
    assert found.evidence["worker_id"] == 2
    assert found.evidence["num_workers"] == 4
    assert [b["batch"] for b in found.evidence["batches"]] == [b for b, _, _ in theirs]
    assert [b["start_us"] for b in found.evidence["batches"]] == [s for _, s, _ in theirs]
    # The imbalance: worker 2's batches wait beyond the others' wait, 15 of them.
    [budget] = result.budget
    assert budget.parts["imbalance"] == pytest.approx(len(theirs) * (slow - fast) / 1e6, abs=1e-6)
    assert budget.largest == "imbalance"
    # Out-of-order delivery lets the others through: it saves part of that, never more.
    assert found.change == {"in_order": False}
    assert 0 < found.saving_s <= budget.parts["imbalance"] + 1e-3
    assert "Worker 2" in found.text and "in_order=False" in found.text


def test_waits_on_the_first_worker_in_line_are_the_pairing_effect(tmp_path):
    # Alike workers under in-order delivery: the batch first in line each round (worker 0's)
    # waits, the others are ready behind it. No worker is slow; the workers cannot keep up.
    plant(str(tmp_path), batches=60, num_workers=2, step_us=10_000, cores=8, cpu_percent=30.0,
          getnext_us=lambda epoch, batch, worker: 30_000 if worker == 0 else 500)
    result = dashboard.analyze(str(tmp_path))
    items = {r.id: r for r in result.recommendations}
    assert "slow_worker" not in items
    [budget] = result.budget
    assert budget.parts["imbalance"] == 0
    assert budget.largest == "throughput"
    assert items["more_workers"].change["num_workers"] > 2


def test_balanced_workers_are_not_blamed_when_fetch_times_say_so(tmp_path):
    # Waits land on worker 0's batches (first in each round), but every worker fetches in the
    # same time: all workers are at their limit, so more workers, not a slow one.
    fetch_us, compute_us = 100_000, 20_000
    plant(str(tmp_path), batches=60, num_workers=4, step_us=compute_us, cores=8, cpu_percent=30.0,
          getnext_us=lambda epoch, batch, worker: 30_000 if worker == 0 else 500,
          fetch_us=lambda batch, worker: fetch_us)
    items = findings(str(tmp_path))
    assert "slow_worker" not in items
    found = items["more_workers"]
    # Workers deliver num_workers / fetch batches a second, the loop takes 1 / compute: the
    # smallest count that keeps up is fetch / compute.
    assert found.evidence["suggested_num_workers"] == math.ceil(fetch_us / compute_us) == 5


def test_saturated_cpus_say_more_workers_will_not_help(tmp_path):
    plant(str(tmp_path), getnext_us=lambda *_: 30_000, first_us=30_000, step_us=30_000, cpu_percent=97.0)
    items = findings(str(tmp_path))
    assert set(items) == {"cpu_saturated"}
    found = items["cpu_saturated"]
    assert found.evidence["cpu_percent"] == 97.0
    assert found.evidence["cores"] == 4
    assert found.evidence["bound"] == "cpu"
    assert "will not help" in found.text and found.change is None
    # Its seconds are the throughput part: all of the steady waiting.
    assert found.saving_s == pytest.approx(40 * 30_000 / 1e6, abs=1e-3)
    # The model's own word on more workers: on a saturated host the scheduler shares the
    # cores between runnable threads, so 4 computing workers get 4 / (4 + others + main) of
    # them where 2 got 2 / (2 + others + main): others = 97 % of 4 cores less the 2 workers'
    # and the main process's 0.5 (30 of every 60 ms). The batch period shrinks by that ratio,
    # the wait with it (the first fill aside: 0.05 s of room).
    others, main = 0.97 * 4 - 2 - 0.5, 0.5
    faster = (4 / (4 + others + main)) / (2 / (2 + others + main))
    wait_after = 40 * max(0.0, 60_000 / faster - 30_000)
    doubled = found.evidence["more_workers_predicted"]
    assert doubled["training_s"] == pytest.approx((40 * 30_000 + wait_after) / 1e6, abs=0.05)
    assert "taking cores from the other processes" in found.text


@pytest.mark.parametrize("fetch_us", [66_000, 51_000, 3_000])
def test_a_hand_over_is_the_workers_cpu_work_only_as_often_as_they_are_busy(tmp_path, fetch_us):
    # Ready batches (their fetch ended 2 ms before the ask) wait 4 ms each to be handed over,
    # on a saturated host: 1 ms of delivery itself (its cap), 3 ms of hand-over. Of that, the
    # workers' own next sample holds up the share of the time they fetch (fetch_us of each
    # worker's 68 ms round): 97 % and 75 % make it the workers' CPU work (cpu_saturated,
    # cheaper samples); at 4 % the wait is delivery on a host whose other processes hold the
    # cores, which neither cheaper samples nor more workers remove: no finding.
    getnext, step = 4_000, 30_000
    plant(str(tmp_path), batches=60, cores=2, cpu_percent=100.0, step_us=step, first_us=getnext,
          getnext_us=lambda *_: getnext, fetch_us=lambda *_: fetch_us, fetch_ready_us=getnext + 2_000)
    [budget] = dashboard.analyze(str(tmp_path)).budget
    assert budget.bound == "cpu"
    assert budget.evidence["handoff_s"] == pytest.approx((getnext - 1_000) / 1e6)
    busy = fetch_us / (2 * (getnext + step))  # fetching, of each worker's two-batch round
    assert budget.evidence["worker_busy"] == pytest.approx(busy, abs=0.02)
    items = findings(str(tmp_path))
    if fetch_us == 3_000:
        assert items == {}, items
        return
    assert set(items) == {"cpu_saturated"}, items
    found = items["cpu_saturated"]
    assert found.evidence["own_handoff_s"] == pytest.approx((getnext - 1_000) / 1e6 * busy, rel=0.03)
    # The text gives the hand-over as measured, and how busy the workers were.
    assert "still waited 3 ms each to be handed over" in found.text, found.text
    assert f"fetching {100 * budget.evidence['worker_busy']:.0f} % of the time" in found.text, found.text


@pytest.mark.parametrize("cores, expected", [(2, "cpu_saturated"), (16, "more_workers")])
def test_a_host_is_saturated_when_less_than_half_a_core_is_free(tmp_path, cores, expected):
    # 88 % busy: on 2 cores 0.24 of a core is free, no room for another computing worker (the
    # cpu scenario read 87-90 % there, and more workers gained 3-5 %); on 16 cores, 1.9 cores.
    plant(str(tmp_path), getnext_us=lambda *_: 30_000, first_us=30_000, step_us=30_000, cpu_percent=88.0,
          cores=cores)
    items = findings(str(tmp_path))
    assert set(items) == {expected}, items
    if expected == "cpu_saturated":
        assert "will not help" in items[expected].text and items[expected].change is None
    else:
        assert items[expected].change["num_workers"] > 2


def test_cpu_headroom_suggests_a_worker_count_and_its_saving(tmp_path):
    batches, wait, compute = 40, 30_000, 30_000
    plant(str(tmp_path), batches=batches, getnext_us=lambda *_: wait, first_us=wait, step_us=compute,
          cpu_percent=30.0, cores=8)
    items = findings(str(tmp_path))
    assert set(items) == {"more_workers"}
    found = items["more_workers"]
    # Two workers deliver a batch every wait + compute: each takes 2 x (wait + compute) to
    # fetch one; keeping up with the compute needs that over compute workers.
    batch = wait + compute
    suggested = math.ceil(2 * batch / compute)
    assert suggested == 4
    assert found.evidence["suggested_num_workers"] == suggested
    assert found.change == {"num_workers": 4}
    new_batch = max(compute, batch * 2 / suggested)
    # What the four workers still cost: the pipeline's first fill (one fetch, 2 x batch) and
    # the delivery of each batch (the planted 1 ms floor); the prediction is scaled by today's
    # measured over replayed wait, 7 % under 1 here (the planted first batch waited less than
    # a fetch): 0.02 s of room.
    steady = batches * (batch - new_batch)
    assert found.saving_s == pytest.approx((steady - 2 * batch - batches * 1_000) / 1e6, abs=0.02)
    assert "num_workers` from 2 to 4" in found.text


def test_input_bound_single_process_loader_is_told_to_use_workers(tmp_path):
    batches, wait, compute = 40, 40_000, 20_000
    plant(str(tmp_path), batches=batches, num_workers=0, cls=SP, getnext_us=lambda *_: wait, first_us=wait,
          step_us=compute, cpu_percent=30.0, cores=4)
    result = dashboard.analyze(str(tmp_path))
    items = {r.id: r for r in result.recommendations}
    assert set(items) == {"use_workers"}
    [budget] = result.budget
    assert budget.parts["main_process"] == pytest.approx(batches * wait / 1e6)
    found = items["use_workers"]
    suggested = math.ceil(wait / compute)  # workers that fetch in `wait` keep up with `compute`
    assert found.evidence["suggested_num_workers"] == suggested == 2
    assert found.evidence["num_workers"] == 0
    # All the wait (two workers fetching in `wait` keep up with `compute`) but what the
    # workers still cost: the pipeline's first fill (one fetch) and a delivery per batch
    # (0.5 ms assumed for workers a trial has not seen).
    steady = batches * (wait + compute - max(compute, wait / suggested))
    assert found.saving_s == pytest.approx((steady - wait - batches * 500) / 1e6, abs=2e-3)
    assert "num_workers=2" in found.text


def test_io_wait_during_stalls_is_storage_bound(tmp_path):
    stall_batches = {10, 20, 30, 40, 50}
    stall, steady = 300_000, 1_000
    windows = []

    def getnext(epoch, batch, worker):
        return stall if batch in stall_batches else steady

    # plant once to learn the stall windows, then again with I/O wait high inside them
    probe = plant(str(tmp_path / "probe"), batches=60, getnext_us=getnext, step_us=20_000, system=False)
    windows = [(s, e) for _, b, _, s, e in probe.getnext if b in stall_batches]
    planted = plant(str(tmp_path / "trial"), batches=60, getnext_us=getnext, step_us=20_000,
                    iowait=lambda t: 40.0 if any(s <= t <= e for s, e in windows) else 0.5)
    items = findings(str(tmp_path / "trial"))
    assert set(items) == {"storage_bound"}  # the stalls explain the wait: no worker-count advice
    found = items["storage_bound"]
    assert found.evidence["stalls"] == len(stall_batches)
    assert sorted(w["start_us"] for w in found.evidence["windows"]) == [s for s, _ in windows]
    assert found.evidence["iowait_percent"] >= storage.IOWAIT_HIGH_PERCENT
    assert found.evidence["iowait_elsewhere_percent"] == pytest.approx(0.5)
    assert found.saving_s == pytest.approx(len(stall_batches) * (stall - steady) / 1e6, abs=1e-3)
    assert planted.getnext == probe.getnext


def test_pin_memory_off_with_gpus_present(tmp_path):
    plant(str(tmp_path / "off"), gpus=2, pin_memory=False)
    plant(str(tmp_path / "on"), gpus=2, pin_memory=True)
    plant(str(tmp_path / "nogpu"), gpus=0, pin_memory=False)
    items = findings(str(tmp_path / "off"))
    assert set(items) == {"pin_memory"}
    assert items["pin_memory"].evidence["gpus"] == 2
    assert "pin_memory=True" in items["pin_memory"].text
    assert findings(str(tmp_path / "on")) == {}
    assert findings(str(tmp_path / "nogpu")) == {}


def test_nodes_get_their_own_verdicts_and_one_merged_finding(tmp_path):
    a = plant(str(tmp_path), host=1, getnext_us=lambda *_: 30_000, first_us=30_000, step_us=30_000,
              cpu_percent=97.0)
    b = plant(str(tmp_path), host=2, getnext_us=lambda *_: 10_000, first_us=10_000, step_us=30_000,
              cpu_percent=97.0)
    result = dashboard.analyze(str(tmp_path))
    nodes = {fmt.system_node_id(1): a, fmt.system_node_id(2): b}  # by host
    assert set(result.nodes_verdict) == set(nodes)
    for node, planted in nodes.items():
        assert result.nodes_verdict[node].input_percent == pytest.approx(planted.input_percent(), abs=0.01)
    processes = [fmt.framework_node_id(MAIN_PID, 1), fmt.framework_node_id(MAIN_PID, 2)]
    wait = sum(e - s for p in nodes.values() for *_, s, e in p.getnext)
    train = sum(e - s for p in nodes.values() for s, e in p.windows())
    assert result.verdict.input_percent == pytest.approx(100.0 * wait / train, abs=0.01)
    by_id = {r.id: r for r in result.recommendations}
    assert sorted(by_id) == ["cpu_saturated", "straggler_rank"]
    assert by_id["cpu_saturated"].evidence["processes"] == sorted(processes)
    # algo-1 waits 50 % of its training, algo-2 25 %: twice the other's share, 25 points above it.
    straggler = by_id["straggler_rank"].evidence
    assert (straggler["node"], straggler["process"]) == ("algo-1", processes[0])
    a_wait = sum(e - s for *_, s, e in a.getnext) / 1e6
    a_train = sum(e - s for s, e in a.windows()) / 1e6
    b_share = sum(e - s for *_, s, e in b.getnext) / sum(e - s for s, e in b.windows())
    assert straggler["excess_s"] == pytest.approx(a_wait - b_share * a_train, abs=0.002)
    # --node narrows the analysis to one node
    one = dashboard.analyze(str(tmp_path), node=fmt.system_node_id(2))
    assert one.verdict.input_percent == pytest.approx(b.input_percent(), abs=0.01)


def test_cli_json_and_text_lead_with_verdict_and_findings(tmp_path):
    plant(str(tmp_path), getnext_us=lambda *_: 30_000, first_us=30_000, step_us=30_000, cpu_percent=97.0)
    out = subprocess.run([sys.executable, os.path.join(ROOT, "app.py"), "analyze", str(tmp_path), "--json"],
                         capture_output=True, text=True, check=True, cwd=ROOT).stdout
    data = json.loads(out)
    assert data["format"] == "smdebug"
    assert data["verdict"]["class"] == "highly" and data["verdict"]["input_percent"] == pytest.approx(50.0)
    assert isinstance(data["verdict"]["basis"], str) and data["verdict"]["basis"]
    assert data["nodes_verdict"]["algo-1"]["class"] == "highly"
    assert data["processes_verdict"][fmt.framework_node_id(MAIN_PID, 1)]["class"] == "highly"
    [item] = data["recommendations"]
    assert set(item) == {"id", "text", "evidence", "saving_s", "change", "predicted"}
    assert item["id"] == "cpu_saturated" and item["change"] is None
    [budget] = data["budget"]
    assert set(budget["parts"]) == {"startup", "throughput", "imbalance", "tail", "main_process", "contention", "residual"}
    assert sum(budget["parts"].values()) == pytest.approx(budget["wait_s"], abs=1e-6)
    assert data["not_recorded"] == [] and data["initialization"]["count"] == 1
    text = to_text(dashboard.analyze(str(tmp_path)))
    assert text.startswith("Verdict: highly input-bound: 50.0 %")
    assert text.index("(cpu_saturated)") < text.index("Trial ") < text.index("GetNext calls")


def test_no_getnext_means_no_verdict(tmp_path):
    metrics = SystemMetricsWriter(str(tmp_path), "algo-1")
    metrics.write([("cpu", "cpu0", "CPUUtilization", 10.0, START_US / 1e6)])
    metrics.close()
    result = dashboard.analyze(str(tmp_path))
    assert result.verdict.input_percent is None and result.verdict.class_ is None
    assert result.recommendations == [] and result.nodes_verdict == {}
    data = to_dict(result)
    assert data["verdict"] == {"input_percent": None, "class": None, "basis": result.verdict.basis,
                               "getnext_s": None, "training_s": None}


def test_a_mixed_trials_verdict_says_which_processes_steps_count(tmp_path):
    # Reference files with steps beside a torch.profiler trace without: the whole job's basis
    # said "no step events", though one process's steps decided its training time.
    import os
    import shutil

    from dashboard.synthetic import write_trial
    from tests.conftest import ROOT

    folder = str(tmp_path / "mixed")
    write_trial(folder, epochs=1, train_batches=10, val_batches=2)
    shutil.copy(os.path.join(ROOT, "tests", "recordings", "mildly_slow_worker", "run.pt.trace.json.gz"), folder)
    result = dashboard.analyze(folder, assess=True)
    assert len(result.processes_verdict) == 2
    basis = result.verdict.basis
    assert "no step events" not in basis, basis
    assert "training steps on the 1 process(es)" in basis and "on the other 1" in basis, basis
