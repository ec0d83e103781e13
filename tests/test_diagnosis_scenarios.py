"""The diagnosis (wait budget, findings, what-if) against real CPU training runs' own books.

Each scenario is a real training job, tests/scenario_job.py, run in a fresh process under the
collector, with one DataLoader fault planted in its Dataset (latency-bound samples, CPU-bound
samples on saturated cores, one slow worker, expensive worker start-up, none at all, and
alike workers in lock-step). The job keeps its own books with time.perf_counter: every
next() it waited, and each epoch's training time. The tests compare the analysis of the
trial with those books; then they re-run the job with the change the finding proposes and
compare the finding's prediction with what the re-run measured.

The tolerances come from repeated runs on the 2-core machine: 5 planted + 5 fixed runs of
each scenario "quiet", and 5 + 5 "loaded", with both cores kept busy by two `yes > /dev/null`.
The quiet runs shared the machine with other engineers' test suites (load average 2-7), so
quiet was itself noisy. Medians [ranges] of the books, wait_s / training_s:

  scenario     runs    planted                                 fixed (the finding's change)
  latency      quiet   3.42 [3.40..4.09] / 4.17 [4.02..4.93]  0.59 [0.30..0.75] / 1.29 [0.87..1.41]  workers 8 (12 once)
               loaded  3.06 [3.01..3.33] / 4.19 [4.07..4.37]  0.50 [0.46..0.77] / 1.59 [1.55..1.85]  workers 6
  cpu          quiet   1.95 [1.64..5.08] / 2.87 [2.58..7.21]  2.40 [1.26..3.76] / 4.52 [2.48..6.16]  workers 4
               loaded  3.19 [2.77..5.38] / 4.55 [4.02..7.69]  2.10 [1.74..3.27] / 3.90 [3.36..6.15]  workers 4
  slow_worker  quiet   1.69 [1.64..1.77] / 2.46 [2.45..2.49]  0.51 [0.48..0.52] / 1.20 [1.20..1.21]  in_order False
               loaded  1.06 [0.95..1.15] / 2.65 [2.63..2.71]  0.61 [0.48..1.09] / 1.95 [1.69..2.79]  in_order False
  startup      quiet   3.41 [3.40..3.41] / 4.11 [4.08..4.21]  0.58 [0.54..0.71] / 1.12 [1.00..1.27]  persistent_workers
               loaded  3.58 [3.56..3.73] / 4.78 [4.66..5.35]  0.72 [0.69..0.77] / 1.65 [1.54..1.82]  persistent_workers
  clean        quiet   0.20 [0.18..0.21] / 2.13 [1.92..2.59]
               loaded  0.62 [0.51..0.85] / 3.70 [3.48..4.85]
  pairing      quiet   2.52 [2.48..2.57] / 3.10 [3.04..3.13]
               loaded  2.38 [2.21..3.54] / 3.59 [3.34..4.87]

With both cores busy the compute per batch is 2-3x slower while the sleeps are not, so the
sleep-based faults shrink against it, and on a loaded machine more processes win a larger
share of the cores: there the slow_worker fix saved 0-36 % (quiet: 51 %), and doubling the
cpu job's workers gained up to 45 % (quiet: at most 14 %). The tolerances below are set from
these numbers; where the loaded runs fall outside one, its comment says so.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import dashboard
from dashboard import format as fmt
from tests.conftest import ROOT

# pytest.ini's marker for tests that run real PyTorch training (as tests/test_collector.py).
pytestmark = pytest.mark.torch

JOB = os.path.join(ROOT, "tests", "scenario_job.py")
PARTS = {"startup", "throughput", "imbalance", "tail", "main_process", "residual"}
# The DataLoader settings a finding may change, and the job's switch for each.
SWITCHES = {"num_workers": "--num-workers", "prefetch_factor": "--prefetch-factor",
            "in_order": "--in-order", "persistent_workers": "--persistent"}

# --- tolerances (each from the repeated runs above) ----------------------------------------

# Verdict wait vs the books' wait, per batch. The collector's GetNext is timed inside the
# loop's own perf_counter window around next(), so the trial can only be shorter: by the
# hook's clock reads and record (measured: 4-8 us per batch, quiet and loaded), and by any
# preemption of the main process between the two clocks, which under load reached 30-67 us
# per batch averaged over a run, and 182 us over one cpu run (a few long deschedulings).
# 0.5 ms per batch is 2.7x the worst measured and a small part of each fault's wait per batch
# (12 to 35 ms in the planted runs): a verdict that lost or added one batch's wait fails. The
# trial rounds each event to 1 us, so it may read longer by that.
WAIT_TOLERANCE_PER_BATCH_S = 0.5e-3
ROUNDING_PER_BATCH_S = 1e-6
# Verdict training time vs the books'. The trial has no step events, so each epoch's window
# ends with its last batch's compute estimated, not measured as the books measure it.
# Measured |verdict - books| was at most 0.93 mean steps per epoch (loaded pairing; quiet at
# most 0.40 latency, 0.34 cpu, 0.29 slow_worker, 0.31 startup, 0.22 clean, 0.16 pairing).
# Two mean steps per epoch is twice the worst: 0.6 % (latency) to 2.7 % (startup, 8 epochs)
# of a planted run's training time.
TRAINING_TOLERANCE_STEPS_PER_EPOCH = 2.0
# A prediction's wait fraction vs the re-run's measured wait_s / training_s (absolute). A
# perfect predictor still meets the re-run's own spread: the fixed runs' wait fraction lay up
# to 0.11 from the median of their condition (latency quiet 0.34..0.53 around 0.45, loaded
# 0.27..0.42 around 0.31; slow_worker loaded 0.28..0.39 around 0.32, quiet within 0.02;
# startup within 0.06), and the prediction starts from one planted run, whose own fraction
# lay up to 0.05 from its median. 0.15 covers the two; a prediction that misses what the fix
# leaves (the delivery cost of every batch, the first epoch's start-up) by more fails.
WAIT_FRACTION_TOLERANCE = 0.15
# A prediction's training time vs the re-run's books (relative). What a predictor can know is
# the re-run's training relative to its planted run; over the repeated pairs that ratio lay
# within 40 % of the median of its condition: the widest, slow_worker loaded, 0.64..1.03
# around 0.74; then latency quiet 0.22..0.32 around 0.29 (-26 %); startup quiet 0.25..0.31
# around 0.27, loaded 0.31..0.37; slow_worker quiet 0.48..0.49. With the planted training
# times 2-4x the fixed ones (quiet), a prediction of half the saving or less fails.
TRAINING_RELATIVE_TOLERANCE = 0.40
# The re-run must show the fix (else comparing the prediction with it says nothing): fixed
# training / planted training was 0.22-0.32 (latency), 0.25-0.31 (startup), 0.48-0.49
# (slow_worker) quiet; loaded 0.37-0.42, 0.31-0.37, and 0.64-1.03 (2 of 5 above 0.75).
FIXED_TRAINING_RATIO_MAX = 0.75
# CPU-bound samples on saturated cores: "more workers gain little". The share of training
# time that doubling the workers saves, measured as the better of two planted runs against
# the better of two re-runs (a single pair is at the mercy of the machine's other load:
# single pairs gained -0.85..+0.29 quiet). Quiet, the better-of-two gain was 0.00-0.14 in 4
# repeats; loaded it was -0.06..+0.45 (2 of 4 above 0.30: against two `yes`, 4 workers take
# a larger share of the cores than 2 do). The analysis' prediction gained -0.05..+0.01.
# 0.30 is twice the quiet worst, and the latency fix saves 58-78 %: a model that took these
# workers for latency-bound ones (twice the workers, half the wait) predicts 0.5 or more.
CPU_GAIN_TOLERANCE = 0.30
# Alike workers in lock-step: the trap the pairing job sets is that the waits fall on one
# worker's batches (first in line each round, worker 0's unless the load shifts the phase)
# although both fetch alike. Measured: the one worker's median wait was 37-55x the other's
# quiet, 3.3-60x loaded; the workers' median fetch times within 1.03x of each other. 2x is
# what a rule reading slowness from waits alone would already call a slow worker.
PAIR_WAIT_SKEW = 2.0
PAIR_FETCH_RATIO = 1.15

# Findings per scenario: the one its planted cause must produce, and ones that would be wrong.
EXPECTED = {"latency": "more_workers", "cpu": "cpu_saturated", "slow_worker": "slow_worker",
            "startup": "persistent_workers"}
WRONG = {
    # latency: storage-like sleeps, alike workers, persistent: not a slow worker, not the CPU, not start-up.
    "latency": {"slow_worker", "cpu_saturated", "persistent_workers", "use_workers"},
    # cpu: more workers would not help (the finding is cpu_saturated instead), nothing else is wrong.
    "cpu": {"more_workers", "slow_worker", "persistent_workers", "use_workers", "storage_bound"},
    # slow_worker: sleeps (no CPU), persistent workers, workers already.
    "slow_worker": {"cpu_saturated", "persistent_workers", "use_workers"},
    # startup: alike fast workers; the steady wait is the per-batch delivery cost only.
    "startup": {"slow_worker", "more_workers", "cpu_saturated", "use_workers"},
}
# The largest part of the wait budget for each planted cause, and its bound where it has one.
LARGEST_PART = {"latency": ("throughput", "latency"), "cpu": ("throughput", "cpu"),
                "slow_worker": ("imbalance", None), "startup": ("startup", None)}
SCENARIOS = ["latency", "cpu", "slow_worker", "startup", "clean", "pairing"]


# --- running the job ---------------------------------------------------------------------------

class Run:
    """One run of the job: its books, its trial folder and the analysis of that trial."""

    def __init__(self, folder, fault: str, change: dict | None):
        self.folder, self.fault, self.change = folder, fault, dict(change or {})
        self.trial = str(folder / "trial")
        books_path = folder / "books.json"
        command = [sys.executable, JOB, "--out", self.trial, "--books", str(books_path), "--fault", fault,
                   *switches(self.change)]
        env = dict(os.environ)
        env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
        for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "GROUP_RANK", "NODE_RANK", "SM_CURRENT_HOST"):
            env.pop(key, None)
        # Output to files, not pipes (worker processes of a crashed job would hold pipes open).
        with open(folder / "stdout.txt", "w") as stdout, open(folder / "stderr.txt", "w") as stderr:
            done = subprocess.run(command, cwd=str(folder), env=env, stdout=stdout, stderr=stderr, timeout=240)
        assert done.returncode == 0, (folder / "stdout.txt").read_text() + (folder / "stderr.txt").read_text()
        self.books = json.loads(books_path.read_text())
        self._result = None

    @property
    def result(self):
        if self._result is None:
            self._result = dashboard.analyze(self.trial)
        return self._result

    @property
    def wait_fraction(self) -> float:
        return self.books["wait_s"] / self.books["training_s"]

    @property
    def mean_step_s(self) -> float:
        return self.books["compute_s"] / self.books["batches"]


def wait_tolerance_s(run: Run) -> float:
    return WAIT_TOLERANCE_PER_BATCH_S * run.books["batches"]


def training_tolerance_s(run: Run) -> float:
    return TRAINING_TOLERANCE_STEPS_PER_EPOCH * run.books["epochs"] * run.mean_step_s


def fraction_tolerance(run: Run) -> float:
    """How far wait / training can move with each within its tolerance of the books."""
    wait, training = run.books["wait_s"], run.books["training_s"]
    dw, dt = wait_tolerance_s(run), training_tolerance_s(run)
    now = wait / training
    return max((wait + dw) / (training - dt) - now, now - max(wait - dw, 0.0) / (training + dt))


def switches(change: dict) -> list[str]:
    args = []
    for key, value in change.items():
        assert key in SWITCHES, f"the change {change} sets {key!r}, which the job has no switch for"
        args += [SWITCHES[key], str(value).lower() if isinstance(value, bool) else str(value)]
    return args


class Jobs:
    """Planted runs, each run once per module and shared by the tests; re-runs on demand."""

    def __init__(self, factory):
        self.factory = factory
        self._planted: dict[str, Run] = {}

    def planted(self, fault: str) -> Run:
        if fault not in self._planted:
            self._planted[fault] = Run(self.factory.mktemp(f"{fault}-planted"), fault, None)
        return self._planted[fault]

    def run(self, fault: str, change: dict | None = None) -> Run:
        name = "-".join(f"{k}-{v}" for k, v in (change or {}).items()) or "planted"
        return Run(self.factory.mktemp(f"{fault}-{name}"), fault, change)


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    return Jobs(tmp_path_factory)


def ids(result) -> list[str]:
    return [r.id for r in result.recommendations]


def finding(result, rid: str):
    found = [r for r in result.recommendations if r.id == rid]
    assert len(found) == 1, f"expected one {rid} finding, got {ids(result)}"
    return found[0]


def only_budget(run: Run):
    budgets = run.result.budget
    assert len(budgets) == 1, f"one training loader on one node, got {[(b.node, b.loader) for b in budgets]}"
    return budgets[0]


# --- the verdict and the budget against the books ---------------------------------------------

@pytest.mark.parametrize("fault", SCENARIOS)
def test_verdict_and_budget_agree_with_the_books(jobs, fault):
    run = jobs.planted(fault)
    books, result = run.books, run.result
    assert books["batches"] == run.books["settings"]["batches"] * books["epochs"]
    batches = books["batches"]

    verdict = result.verdict
    low = books["wait_s"] - wait_tolerance_s(run)
    high = books["wait_s"] + ROUNDING_PER_BATCH_S * batches
    assert low <= verdict.getnext_s <= high, (verdict.getnext_s, books["wait_s"])
    training_tolerance = training_tolerance_s(run)
    assert verdict.training_s == pytest.approx(books["training_s"], abs=training_tolerance)
    assert verdict.input_percent == pytest.approx(100 * verdict.getnext_s / verdict.training_s, abs=0.01)

    budget = only_budget(run)
    assert isinstance(budget.node, str) and isinstance(budget.loader, str)
    assert set(budget.parts) == PARTS
    assert all(value >= -1e-6 for value in budget.parts.values()), budget.parts
    assert sum(budget.parts.values()) == pytest.approx(budget.wait_s, rel=1e-6)
    # One training loader: its budget is the whole verdict.
    assert low <= budget.wait_s <= high, (budget.wait_s, books["wait_s"])
    assert budget.training_s == pytest.approx(books["training_s"], abs=training_tolerance)
    assert budget.bound in ("latency", "cpu", "unknown")

    (as_json,) = result.to_dict()["budget"]
    for key in ("node", "loader", "training_s", "wait_s", "bound"):
        assert as_json[key] == getattr(budget, key), key
    assert as_json["parts"] == pytest.approx(budget.parts)


@pytest.mark.parametrize("fault", sorted(LARGEST_PART))
def test_the_largest_part_of_the_budget_is_the_planted_cause(jobs, fault):
    budget = only_budget(jobs.planted(fault))
    part, bound = LARGEST_PART[fault]
    largest = max(budget.parts, key=budget.parts.get)
    assert largest == part, budget.parts
    if bound is not None:
        assert budget.bound == bound, (budget.bound, budget.parts)


# --- the findings --------------------------------------------------------------------------------

@pytest.mark.parametrize("fault", sorted(EXPECTED))
def test_the_planted_cause_is_found_and_no_wrong_cause(jobs, fault):
    run = jobs.planted(fault)
    found = ids(run.result)
    assert EXPECTED[fault] in found, found
    assert not WRONG[fault] & set(found), found
    if run.books["settings"]["persistent"]:
        assert "persistent_workers" not in found
    if fault == "slow_worker":
        assert finding(run.result, "slow_worker").evidence["worker_id"] == run.books["settings"]["slow_worker_id"]


def test_a_clean_job_gets_no_findings(jobs):
    result = jobs.planted("clean").result
    assert result.recommendations == [], [(r.id, r.text) for r in result.recommendations]


def test_alike_workers_in_lock_step_are_not_a_slow_worker(jobs):
    run = jobs.planted("pairing")
    # The trap is set: in order, the waits fall on one worker's batches (first in line each
    # round), while the workers fetch alike (the collector's worker-side fetch times).
    frame = dashboard.load_trial(run.trial).framework
    getnext = frame[frame["kind"] == fmt.KIND_GETNEXT]
    waits = getnext.groupby(getnext["worker_id"].astype(int))["duration_us"].median()
    fetches = frame[frame["kind"] == fmt.KIND_FETCH]
    fetch = fetches.groupby(fetches["worker_id"].astype(int))["duration_us"].median()
    assert sorted(waits.index) == sorted(fetch.index) == [0, 1]
    assert max(waits) >= PAIR_WAIT_SKEW * max(min(waits), 1.0), waits.to_dict()
    assert max(fetch) <= PAIR_FETCH_RATIO * min(fetch), fetch.to_dict()
    assert "slow_worker" not in ids(run.result), [(r.id, r.text) for r in run.result.recommendations]


# --- the predictions against re-runs with the change -------------------------------------------

@pytest.mark.parametrize("fault", ["latency", "slow_worker", "startup"])
def test_the_fix_does_what_its_finding_predicts(jobs, fault):
    planted = jobs.planted(fault)
    recommendation = finding(planted.result, EXPECTED[fault])
    change, predicted = recommendation.change, recommendation.predicted
    assert isinstance(change, dict) and change, change
    assert predicted is not None and set(predicted) >= {"wait_fraction", "training_s"}, predicted

    # The what-if of the same change starts from today's books.
    (what_if,) = planted.result.what_if(change)
    assert what_if.change == change
    assert what_if.now["wait_fraction"] == pytest.approx(planted.wait_fraction, abs=fraction_tolerance(planted))
    assert what_if.now["training_s"] == pytest.approx(planted.books["training_s"], abs=training_tolerance_s(planted))

    fixed = jobs.run(fault, change)
    ratio = fixed.books["training_s"] / planted.books["training_s"]
    assert ratio <= FIXED_TRAINING_RATIO_MAX, (
        f"the re-run with {change} trained {ratio:.2f}x as long as the planted run: the machine is too "
        f"busy for this scenario to show its fix (see FIXED_TRAINING_RATIO_MAX)")
    assert predicted["wait_fraction"] == pytest.approx(fixed.wait_fraction, abs=WAIT_FRACTION_TOLERANCE), (
        predicted, fixed.books["wait_s"], fixed.books["training_s"])
    assert predicted["training_s"] == pytest.approx(fixed.books["training_s"], rel=TRAINING_RELATIVE_TOLERANCE), (
        predicted, fixed.books["training_s"])


def test_more_workers_gain_little_when_the_cores_are_saturated(jobs):
    planted = jobs.planted("cpu")
    workers = planted.books["settings"]["num_workers"]
    change = {"num_workers": 2 * workers}
    (what_if,) = planted.result.what_if(change)
    assert what_if.change == change
    assert what_if.predicted is not None
    assert what_if.now["wait_fraction"] == pytest.approx(planted.wait_fraction, abs=fraction_tolerance(planted))
    assert what_if.now["training_s"] == pytest.approx(planted.books["training_s"], abs=training_tolerance_s(planted))
    predicted_gain = 1 - what_if.predicted["training_s"] / what_if.now["training_s"]
    assert abs(predicted_gain) <= CPU_GAIN_TOLERANCE, what_if

    # Measured: the better of two runs each way (see CPU_GAIN_TOLERANCE).
    planted_s = min(planted.books["training_s"], jobs.run("cpu").books["training_s"])
    doubled_s = min(jobs.run("cpu", change).books["training_s"] for _ in range(2))
    measured_gain = 1 - doubled_s / planted_s
    assert measured_gain <= CPU_GAIN_TOLERANCE, (planted_s, doubled_s)

    # The JSON form of the what-ifs: the contract's keys, today's numbers as what_if() has them.
    for item in planted.result.to_dict()["what_if"]:
        assert {"node", "loader", "change", "now", "predicted"} <= set(item)
        if (item["node"], item["loader"]) == (what_if.node, what_if.loader):
            assert item["now"] == pytest.approx(what_if.now)
