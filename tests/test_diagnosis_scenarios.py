"""The diagnosis (wait budget, findings, what-if) against real CPU training runs' own books.

Each scenario is a real training job, tests/scenario_job.py, run in a fresh process under the
collector, with one DataLoader fault planted in its Dataset (latency-bound samples, CPU-bound
samples on saturated cores, one slow worker, expensive worker start-up, none at all, and
alike workers in lock-step). The job keeps its own books with time.perf_counter: every
next() it waited, and each epoch's training time. The tests compare the analysis of the
trial with those books; then they re-run the job with the change the finding proposes and
compare the finding's prediction with what the re-run measured.

The tolerances come from repeated runs on the 2-core machine, "quiet" and "loaded" (both
cores kept busy by two `yes > /dev/null`). The quiet runs shared the machine with other
engineers' test suites (load average 2-7), so quiet was itself noisy. Medians [ranges] of the
books, wait_s / training_s, n runs each way, in the configuration of tests/scenario_job.py:

  scenario     runs    n  planted                                fixed (with the finding's change)
  latency      quiet   8  3.41 [3.33..4.09] / 4.12 [4.02..4.93]  0.55 [0.30..0.75] / 1.28 [0.87..1.43]  workers 8, 12
               loaded  8  3.02 [2.58..3.33] / 4.28 [4.07..4.59]  0.65 [0.46..1.15] / 1.79 [1.55..2.72]  workers 4-8
  cpu          quiet   8  2.17 [1.64..5.08] / 3.29 [2.58..7.21]  2.34 [1.26..3.76] / 4.48 [2.48..6.16]  workers 4
               loaded  8  3.89 [2.77..5.74] / 5.76 [4.02..9.21]  2.67 [1.74..3.26] / 5.59 [3.36..6.15]  workers 4
  slow_worker  quiet   3  3.99 [3.88..4.02] / 4.75 [4.74..4.75]  1.13 [1.11..1.15] / 1.86 [1.85..1.86]  in_order False
               loaded  3  3.30 [3.24..3.38] / 4.84 [4.81..4.86]  0.75 [0.67..0.76] / 2.03 [2.02..2.05]  in_order False
               (4 workers: with 8, as first measured, the loaded runs' compute hid the slow worker)
               quiet   8  3.57 [3.45..3.73] / 4.79 [4.77..4.81]  0.33 [0.29..0.36] / 1.44 [1.32..1.66]  worker 1 as fast
               loaded  8  2.94 [2.65..3.02] / 4.87 [4.83..4.92]  0.65 [0.63..0.70] / 2.33 [2.22..2.64]  (--slow-factor 1)
               (4 groups A B B A each way; the finding's prediction, means of A: training 0.98-1.11x the
               fixed runs' quiet, 0.99-1.18x loaded; waiting share 0.04 under to 0.01 over quiet,
               0.01-0.06 under loaded)
  startup      quiet   8  3.41 [3.38..3.51] / 4.13 [4.08..4.30]  0.58 [0.52..0.71] / 1.12 [1.00..1.46]  persistent
               loaded  8  3.67 [3.56..3.88] / 5.07 [4.66..5.54]  0.73 [0.69..0.86] / 1.66 [1.54..2.16]  persistent
  clean        quiet   8  0.20 [0.18..0.46] / 2.21 [1.92..3.00]
               loaded  8  0.67 [0.51..1.30] / 4.03 [3.48..6.63]
  pairing      quiet   8  3.17 [3.04..3.24] / 3.63 [3.59..3.88]
               loaded  6  2.93 [2.82..3.25] / 4.15 [3.83..4.60]
  contention   quiet   3  0.72 [0.69..0.79] / 5.75 [5.64..6.71]  0.33 [0.31..0.34] / 3.26 [3.15..3.36]  no busy processes
               quiet   8  0.76 [0.73..0.87] / 6.47 [5.83..7.24]  0.35 [0.30..0.37] / 3.60 [3.16..3.77]  (A B B A, 4 groups)

With both cores busy the compute per batch is 2-3x slower while the sleeps are not, so the
sleep-based faults shrink against it, and more processes win a larger share of the cores
from the other load: doubling the cpu job's workers gains up to 45 % (quiet: at most 14 %),
which the model predicts (see CPU_GAIN_TOLERANCE). The tolerances below are set from these
numbers; where the loaded runs fall outside one, its comment says so.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

import pytest

import dashboard
from dashboard import format as fmt
from dashboard.display import duration_s
from dashboard.analysis.diagnosis.findings import MIN_SHARE_OF_JOB
from dashboard.analysis.diagnosis.findings import imbalance as imbalance_finding
from tests.conftest import ROOT

# pytest.ini's marker for tests that run real PyTorch training (as tests/test_collector.py).
pytestmark = pytest.mark.torch

JOB = os.path.join(ROOT, "tests", "scenario_job.py")
PARTS = {"startup", "throughput", "imbalance", "tail", "main_process", "contention", "residual"}
# The DataLoader settings a finding may change, and the job's switch for each.
SWITCHES = {"num_workers": "--num-workers", "prefetch_factor": "--prefetch-factor",
            "in_order": "--in-order", "persistent_workers": "--persistent"}

# --- tolerances (each from the repeated runs above) ----------------------------------------

# Verdict wait vs the books' wait, per batch. The collector's GetNext is timed inside the
# loop's own perf_counter window around next(), so the trial can only be shorter: by the
# hook's clock reads and record (measured: 4-10 us per batch, quiet and loaded), and by any
# preemption of the main process between the two clocks, which under load reached 25-107 us
# per batch averaged over a run, and 182 us over one cpu run (a few long deschedulings).
# 0.5 ms per batch is 2.7x the worst measured and a small part of each fault's wait per batch
# (11 to 44 ms in the planted runs; clean 1.2 ms): a verdict that lost or added one batch's
# wait fails. The trial rounds each event to 1 us, so it may read longer by that.
WAIT_TOLERANCE_PER_BATCH_S = 0.5e-3
ROUNDING_PER_BATCH_S = 1e-6
# Verdict training time vs the books'. The collector records each epoch's first next() and
# the next() that ends it (StopIteration, right after the last step), so the trial's window
# is the books' window: measured |verdict - books| was at most 0.1 ms per run (36 runs, quiet
# and loaded). They can differ only by a preemption between the loop's clock and the
# collector's at those two calls, a few ms at worst on this machine under load (see above).
# 5 ms per epoch. (Before the collector recorded the epoch's end, the analysis estimated each
# epoch's last step, and was off by up to 0.93 mean steps, 37 ms, per epoch.)
TRAINING_TOLERANCE_PER_EPOCH_S = 5e-3
# A prediction's wait fraction vs the re-run's measured wait_s / training_s (absolute). A
# perfect predictor still meets the re-run's own spread: the fixed runs' wait fraction lay up
# to 0.11 from the median of their condition (latency quiet 0.34..0.53 around 0.44, loaded
# 0.27..0.46 around 0.35; slow_worker quiet 0.30..0.39 around 0.34; startup quiet
# 0.46..0.56, loaded 0.40..0.46), and the prediction starts from one planted run, whose own
# fraction lay 0.05 (0.08 slow_worker) from its median quiet. Quiet, predictions missed by at
# most 0.07 (slow_worker, 3 repeats) to 0.11 (latency). With both cores busy the re-run
# waits more and computes less than the planted run (its training time is still predicted
# within 10 %): the loaded slow_worker re-runs' fraction was 0.15..0.21 above the prediction,
# latency's 0.18 in a loaded suite run. 0.25 is that worst with room; a prediction that
# leaves out what the fix keeps (the delivery cost of every batch, the first round's
# start-up, the queueing of the steady state) misses by more (0.3 to 0.6 here) and fails.
WAIT_FRACTION_TOLERANCE = 0.25
# A prediction's training time vs the re-run's books (relative). What a predictor can know is
# the re-run's training relative to its planted run; over the repeated pairs with the same
# change that ratio lay within 27 % of its condition's median (latency quiet 0.22..0.34
# around 0.30, loaded 0.37..0.42 for 6 workers, 0.48..0.63 for 4; slow_worker (4 workers)
# quiet 0.39, loaded 0.42; startup quiet 0.25..0.34 around 0.27, loaded
# 0.31..0.39 around 0.33). 35 % is 1.3x that; with the planted runs training 2-4x as long as
# the fixed ones (quiet), a prediction of half the saving or less fails.
TRAINING_RELATIVE_TOLERANCE = 0.35
# The re-run must tell the prediction apart from "nothing changes", else comparing them says
# nothing: the predicted training time must lie nearer the re-run's than the planted run's
# does. (This replaced a bar on the fix's size, fixed / planted training <= 0.75, measured
# 0.34-0.39 quiet and 0.39-0.63 loaded. A loaded suite run on a host twice as slow as those,
# 22 ms of compute a step against 11, failed it with predictions that held: latency 0.82,
# predicted 3.09 s against 3.49 s measured; slow_worker 0.81, 3.31 s against 4.00 s.)
# A prediction is compared with re-runs on means of runs made in one stretch of time in the order
# A B B A (today's settings, the change, the change, today's), as the cpu test does (see
# CPU_GAIN_TOLERANCE): a host whose speed drifts slows both sides alike. On single pairs in two
# full suite runs with two `yes`, on a host then 1.5-2x slower than in the runs the tolerances
# come from (the main process computed 22-41 ms a batch against 10-16), the same job's compute
# moved 20-30 % from one run to the next with no change of load that the probes see: the
# slow_worker re-run out of order waited 0.94 s less, as predicted within 10 %, but trained only
# 0.22 s shorter (predicted 3.98 s, measured 4.78 s, planted 5.00 s).
# One stretch of time means all four runs: a quiet suite run (2026-12-03) failed the startup
# pair when its first A was the module's shared planted run, made 2.3 minutes before the other
# three. It trained 5.06 s where the A made right after the re-runs trained 4.29 s (the same
# job); their predictions were 2.02 s and 1.34 s, the re-runs trained 1.19 s and 1.28 s: the
# means missed by 1.36x, the later pair alone by 1.09x. 16 runs of that job in 4 groups A B B A
# made in one stretch each (host steal 1-19 %): the means' predictions were 0.84-1.10x the
# re-runs'. Every A of a comparison is now made with its B's (Jobs.steady).
# CPU-bound samples on saturated cores: doubling the workers gains what the model predicts
# (on a saturated host the scheduler shares the cores between runnable threads: more workers
# take cores from the main process and from other processes). With 4 workers for 2 cores the
# outcome is bimodal: the main process shares its core with one worker or with two for the whole
# run (its compute 1.40-1.56 s or 2.02-2.08 s), so a single re-run gains +0.17..+0.21 or loses
# 0.12..0.21 (quiet, 5 alternating pairs; predicted +0.02..+0.06). The model predicts the
# average, so the gain is measured on means, over runs made in one stretch of time in the order
# A B B A (2 workers, 4, 4, 2: a host whose speed drifts evenly slows both sides alike), and the
# prediction is the mean of the two A runs' own. On the same 5 pairs, as four A B B A groups:
# measured -0.01..+0.05 against predicted +0.03..+0.04; the worst draw (both re-runs in the slow
# mode) measures about -0.13. This test, 3 runs quiet: predicted +0.05..+0.08 against measured
# +0.05..+0.08 (|miss| <= 0.04); 3 with two `yes`: +0.12..+0.14 against +0.08..+0.20 (<= 0.06).
# The design before compared the better of two runs each way, one of them the module's planted
# run: in a quiet CI run that run was 2 minutes older and 24 % faster than its repeat (3.08 s
# against 3.83 s, the same job), both re-runs drew the slow mode, and it measured -0.31 against
# a prediction of 0.00. 0.20 holds the worst draw (0.17 from a prediction
# of +0.04) and is far from what the wrong models predict: the one before (it capped the workers
# at the cores less all of the main process's use, so more workers got fewer cores than today's)
# predicted -0.07..-0.13 quiet, and a model that took these workers for latency-bound ones (twice
# the workers, half the wait) predicts a gain of 0.5 or more.
# A quiet full suite then failed it with one group: predicted +0.087, measured -0.161 (A 2.48,
# 2.53 s; B 2.65, 3.16 s: one re-run drew a mode 19 % slower than its pair). 20 pairs A B run
# back to back on a quiet host (2026-12-03): single-pair gains -0.21..+0.18, predictions
# -0.05..+0.12 (the mean of all: measured +0.01, predicted +0.05). Drawing pairs from them (10^4
# draws, each pair kept whole: its two runs share the host's speed at that time), the miss of one
# A B B A group exceeds 0.20 in 3.3 % of draws (p99 0.24); of two groups' means in 0.4 % (p95
# 0.14, p99 0.18); of three in 0.08 %. Hence CPU_GAIN_GROUPS = 2 (8 re-runs, about 30 s more).
# OPEN DEFECT, with other processes busy (two `yes`, 8 pairs): the model predicts too little
# gain, +0.02..+0.16 against +0.11..+0.38 measured (two groups' miss: p50 0.15, above 0.20 in 18
# % of draws). There today's wait is almost all hand-over (a finished batch waited ~32 ms for the
# main process to take it, 3.8 ms when stored ahead), which the replay keeps at today's cost;
# the re-runs with 4 workers waited half as long. Counting the other processes by their runnable
# threads (from the workers' measured contention) instead of their use of the cores moved the
# workers' cores the right way (1.14 -> 1.27 of 2) but lowered the prediction: the replay's wait
# is not monotonic in the cores there (a faster supply turns stored batches into received ones at
# 32 ms each). Not fixed: the hand-over's cost under other load needs its own model.
CPU_GAIN_GROUPS = 2
CPU_GAIN_TOLERANCE = 0.20
# The hand-over the cpu_saturated finding names (finished batches waiting for the worker's
# queue thread, which needs the GIL and a core that the next sample's work holds) is removed by
# what the finding asks for, cheaper samples: with a quarter of the work per sample (--spin
# 10000) it fell to 0.22..0.33 of the planted run's in 4 quiet pairs (4.8..6.9 ms -> 1.5..2.3
# ms) and to 0.27..0.41 in 4 pairs with two `yes` (9.6..12.0 ms -> 3.1..4.4 ms). The test takes
# the mean of HANDOFF_RUNS runs each way, in groups A B B A (its bound: below). (A shorter GIL
# switch interval shortened it quiet, 0.02..0.55 in 14 pairs, but hardly in a loaded suite run,
# 0.87: there the cores held it. The text names both.) With one busy core (one `yes`), 5 groups A
# B B A: planted 6.8..15.4 ms, cheaper 2.4..4.0 ms, group ratios 0.26..0.37. One suite run with
# one busy core failed at 0.79 when the runs were made A A B B: planted 8.3 and 2.8 ms, cheaper
# 4.4 and 4.3 (no planted run of those 20 was under 6.8 ms); the runs are now made A B B A.
# On 2026-12-05's host (CI, and 3 groups quiet) one GIL switch interval held most ready batches
# either way: planted 4.6-10.1 ms in two modes (4.6-5.5 or 8.4-10.1), cheaper 3.7-4.8 ms, group
# ratios 0.46, 0.64, 0.79 and 0.80 (the books' ready batches' means fell further, 15-20 ms ->
# 5.5-6.5 ms; the finding names their median). Drawn from those 8 runs each way, the mean of 2
# runs each way passed 0.7 in 60 % of draws; the mean of 4, 0.9 in 99 % (0.85: 95 %).
# That hand-over was the median of every batch there at the ask, stored ones too, which flips
# with their share: a loaded suite run (2026-12-06) failed at 1.18 (planted 0.15, 5.7, 5.3 and
# 9.4 ms, cheaper 4.6-7.2 ms) while the books' hand-overs fell from 12-21 ms to 6-8 ms (medians).
# It is now the mean of those taken from the queue (pipeline.PipelineModel.handoff_us): those
# runs' planted 19-38 ms, cheaper 7.8-9.2 ms (ratio 0.31); quiet, 2 groups: 21-26 ms against
# 5.0-6.2 ms (0.24 and 0.25), where the median gave 0.84 and 0.77.
HANDOFF_CHEAPER_SPIN = "10000"
HANDOFF_RUNS = 4
HANDOFF_RATIO_MAX = 0.9
# Of a ready batch's wait in the planted run, the hand-over's share: 0.97-0.98 quiet (4.8-6.9 ms,
# delivery itself 0.11-0.15 ms), 0.78 in a full suite run with two `yes` (3.5 of 4.5 ms, delivery
# itself at its 1 ms cap). (This replaced "delivery itself <= 1 ms", which its cap always met: it
# failed once only on the rounding of 0.004544 - 0.003544.)
HANDOFF_SHARE_MIN = 0.5
# Alike workers in lock-step: the trap the pairing job sets is that the waits fall on one
# worker's batches (first in line each round, worker 0's unless the load shifts the phase)
# although both fetch alike. Measured: that worker's median wait was 38-122x the other's
# quiet, 13-33x loaded (the earlier, lighter pairing job: down to 0.08x, the phase flipped,
# and 1.4x once), and the workers' median fetch times within 1.01x of each other. 2x is what
# a rule reading slowness from waits alone would already call a slow worker.
PAIR_WAIT_SKEW = 2.0
PAIR_FETCH_RATIO = 1.15

# A prediction is compared with a re-run only when the host's other load was the same for
# both: the tolerances above come from pairs run under one condition, and a pair that spans a
# change of load measures the load, not the fix. (In a loaded suite run on a slower host, a
# startup planted run under a heavier load than its re-run's gave "predicted 3.14 s, measured
# 1.99 s"; its pair on one load predicts within 25 %.) The load is the kernel's count of
# runnable tasks besides the test's own (procs_running in /proc/stat), sampled every 10 ms for
# PROBE_S before and after each run (it needs no core itself, unlike timing a spin, which
# read 0.49-0.92 of a core with two `yes` running). Measured: quiet 0.00-0.06, two `yes`
# 2.00-2.04, four 4.00-4.02. A pair whose probes differ by more than STEADY_OTHERS (half a
# task: another process that ran through a probe) is run again, at most STEADY_ATTEMPTS
# times, and the test fails saying so if the load never held.
PROBE_S = 0.3
PROBE_EVERY_S = 0.01
STEADY_OTHERS = 0.5
STEADY_ATTEMPTS = 3
# The hypervisor's other guests are load too, which procs_running does not see: the cores'
# time stolen from this machine while a run ran (/proc/stat's steal over all of it), as a share
# of the host's cores. A quiet suite run once got a contention pair that trained 1.6-1.9x slower
# than its other runs (9.9 and 6.2 s against 5.6-7.2 and 3.1-4.0 s), no other task runnable: the
# re-run's batches still waited 3.1 ms each to be handed over (1.8-2.2 ms in the other quiet
# re-runs), and removing the job's two busy processes removed half the waiting the finding
# counts (whether stolen time was that load is not known: the run did not record it; it is the
# load of this kind that the kernel does count). Idle, this machine's steal reads under 0.5 % of
# its cores. A run with more than STOLEN_LOADED of them stolen ran on a loaded host. Runs are
# compared by the means of those without the change and those with it (A B B A), so their steal
# is too: runs whose two means differ by more than STOLEN_LOADED are made again, as runs whose
# runnable tasks differ. (Compared run by run, as once, a quiet suite run failed the slow_worker
# pair in all 3 attempts: the other guests' load came and went for minutes, 0-12 % from one run
# to the next, [0.0, 0.9, 5.4, 12.0], [8.5, 5.2, 0.5, 0.1], [0.9, 3.2, 10.8, 6.1] % in the order
# A B B A, while the means of A and B differed by 2.9, 1.5 and 3.5 %.)
STOLEN_LOADED = 0.05
# Load that comes and goes between the probes: the cores that processes other than the job and
# its own kept busy while it ran (/proc/stat's busy time less the job's, from the rusage of the
# test's waited-for children). Read quiet: -0.012..+0.014 cores over 60 runs; one of this test's
# own jobs running beside: 0.5-1.2. A run that read more than OTHERS_CORES_LOADED ran on a
# loaded host. (Not compared between the runs of a pair as a level: other load takes a share of
# the cores that depends on how many the job itself asks for, so the same `yes` reads less
# beside the contention job's busy processes than beside the job alone.)
OTHERS_CORES_LOADED = 0.1
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")

# Other processes on the host: the planted cause is what a job waits for only while the books say
# so. When they keep the cores busy, finished batches wait to be handed over whatever the fault
# (budget._contention), and the books see it: the part of each next() after the batch's collation
# ended (scenario_job's handovers_s). The latency job's steady batches' hand-over was this share of
# its whole wait: quiet 0.15, with two `yes` 0.08-0.28, four 0.41-0.50, six 0.71-0.87; with six,
# raising its workers from 2 to 4 or 8 left its wait as it was (1.7-2.2 s against 1.7-2.4 s, 2 runs
# each), and the diagnosis named host contention, not more workers. (A suite run with two `yes` and
# other tests' leftovers once got no finding at all for it, before host contention was a part of
# the budget.) Where more than half of the wait was steady hand-over on a host with other load,
# host contention is the expected finding in the planted cause's place, and the planted cause's fix
# is not re-run: the test cannot take the host's other load away. Not for workers that compute:
# there the hand-over waits for the GIL their next sample holds (the cpu job: 0.71 of its wait
# with two `yes`), which is the planted cause itself, and cpu_saturated names it.
HANDOVER_DISPLACES = 0.5
# The contention part is hand-over (it cannot exceed the books' own, but for the books' window
# around next() being the wider one: 7-13 us a batch measured) and most of it on the contention
# job: 0.60-0.70 of the books' steady hand-over in 8 quiet runs. 0.4 leaves room.
CONTENTION_OF_HANDOVER_MIN = 0.4
# Host contention's saving vs the waiting that removing the other processes removed (relative):
# quiet, 8 pairs of the contention job with and without its two busy processes: the saving was
# 0.94-1.23x the waiting removed (budget.FIRST_MODE_QUANTILE); the clean job with two
# `yes` against it quiet, 0.80x. 0.35 is 1.5x the worst; a part that counted the whole hand-over
# beyond delivery itself (1.2-1.3x the removed on those pairs, 1.6-1.9x for all of it) meets it
# only in part, and one that counted nothing fails. The test compares means of A B B A runs
# (with them, without, without, with): 6 such groups quiet gave 0.94-1.14x, 2 of them with the
# nanny's environment named below (their single pairs 0.90-1.23x). Two quiet suite runs (one of
# them CI's) failed the single-pair test before, 0.42 s predicted against 0.14 s removed and 0.54
# against 0.13, on pairs that computed 1.5-1.7x slower than the job alone with no other load
# seen: every job after tests/test_dask.py had inherited the environment a LocalCluster's nanny
# writes into its parent's (see conftest.environment_kept), and load that came and went between
# the probes was not seen (see OTHERS_CORES_LOADED). Which of the two (or the single pair's
# noise) made those misses is not known: the runs alone with that environment did not miss.
# A third quiet suite run (of 2026-12-03) missed on one group, 0.41 s predicted against 0.26 s removed:
# its runs beside the busy processes waited 0.59 and 0.79 s, alone 0.44 and 0.41 s, where 16
# more quiet pairs (standalone, alternating which ran first) waited 0.64-0.84 s and 0.26-0.37 s
# and the saving was 0.93-1.23x the waiting removed (their uncontended hand-over alone 1.6-2.0
# ms a batch, that group's 2.1). The prediction of each run beside was its usual share of its
# wait (0.54 and 0.63); the group drew a quick run beside and two slow ones alone. The test
# measures CONTENTION_GROUPS groups A B B A and compares their means, as the more-workers test
# does (with that group and a usual one, 1.25x).
CONTENTION_SAVING_TOLERANCE = 0.35
CONTENTION_GROUPS = 2
# The job's own hand-over and delivery stay throughput's beside the busy processes: its throughput
# part there against the re-run's without them (relative). 6 quiet pairs: 0.77-1.20x; the means
# of the 6 A B B A groups above: 0.77-0.94x. With the residual taken before the contention (it
# then held the contention's queueing, which the replay did not model), the same pairs gave 0,
# 0, 0.15, 0.59, 0.61 and 0.98x.
CONTENTION_THROUGHPUT_TOLERANCE = 0.35
# Whether out-of-order delivery helps a slow worker depends on how much of its delay the compute
# hides, so on the host's speed: the finding must propose it where the re-runs gain, and claim
# no gain where they lose (findings/imbalance.py: out of order every batch is handed over
# from the result queue, a round trip to a worker, which on a busy host costs about what the order
# does). The slow_worker job with its slow worker's delay partly hidden behind more compute per
# batch (--hidden 2560) and the job's own two busy processes beside it (--hogs 2) sits near that
# line. Measured in A B B A groups (planted, out of order, out of order, planted):
# - on 2026-12-03 (first session), 4 groups quiet: the imbalance part 0.25-0.29 s of 0.6-0.75 s
#   of wait; out of order removed +0.01, -0.02, +0.01 and -0.08 s of wait; every planted run
#   named the slow worker and proposed no change. With two `yes` besides (2 groups) the slow
#   worker faded: 1 of 4 planted runs named it, out of order removed -0.24 and 0.00 s;
# - on 2026-12-03 (a later session, and CI the same day), 4 groups quiet: the imbalance part
#   0.28-0.89 s of 0.80-1.35 s of wait; out of order trained 3.62-4.22 s against 4.92-5.15 s
#   (means 3.87 and 4.98 s: a gain of 22 %), and waited 0.54-0.68 s. With the hand-over out of
#   order charged as the mean of all received batches, 7 of 8 planted runs proposed it and one
#   predicted it 0.39 s slower; charged as a waited-for batch's (pipeline._delivery_by_path), all
#   12 planted runs propose it, predicting 4.24-5.00 s (means 1.18x the re-runs': the re-runs
#   also computed faster) and 0.48-0.84 s of wait.
# The decision is checked where the re-runs' gain is clear of the finding's bar (2 % of the job,
# about 0.1 s) by one bar either way: a gain of twice the bar or more, and the planted runs that
# name the slow worker propose it (all but NOT_HELPING_MISSES of them: each decides on its own
# prediction, whose saving spread 0.14-0.69 s over the 12 runs above); a loss of a bar or more,
# and none claims a gain (a proposal within the prediction's spread says it cannot tell the
# change's effect from none, and claims nothing). Clear means shown by the runs themselves, not only by their means: a
# one-sided Welch t-test of the training times against that margin at p < NOT_HELPING_P. On
# 2026-12-04, a suite run with two `yes` besides: the planted runs trained 5.19-6.24 s, the
# out-of-order ones 5.08-5.87 s, a gain of 0.36 s of means against a margin of 0.23 s, with
# out of order waiting more (0.84-1.06 s against 0.74-0.90 s); no planted run proposed it (each
# predicted it no faster, its wait 1.10 s against 0.95 s measured). A difference of means of 4
# runs that spread 1 s is no measure of a 0.23 s margin (t 0.5, p 0.3); the quiet groups above
# clear it by far (a gain of 1.11 s: p about 0.001 from the ranges above), as did the same day's
# quiet run of the test alone (a gain of 1.59 s, 4 of 4 proposed). Where none proposes it, out of
# order must remove less than NOT_HELPING_SHARE of the imbalance part (on a quiet host: with two
# `yes` the waits' noise is the size of the part, see above). The training time predicted is
# checked on both hosts. On 2026-12-05, CI: the re-runs trained 0.78 s faster (means), waiting
# 0.25 s less; the planted runs predicted savings of -0.18, +0.65, +0.07 and +0.13 s, 2 of 4 over
# the finding's bar (0.1 s), which then decided: the replay left out the fetches' measured
# queueing for a core (pipeline.PipelineModel.cpu_stretch), and one run's out-of-order cost was
# the mean of 3 hand-overs (pipeline.MIN_RECEIVED). With both fixed, the file run quiet:
# a gain of 0.63 s (the wait 0.10 s of it), savings -0.22, +0.14, +0.19 and +0.07 s: the main
# process computes faster out of order, which the prediction then left out (it now counts the
# slower step after each long wait: pipeline._idle_compute). The change is now
# proposed unless predicted slower beyond what the out-of-order cost's spread allows, saying so
# within it (findings/imbalance.py): that file run again, 4 of 4 proposed it twice (re-runs'
# gains 0.24 and 0.16 s, their waits 0.04 and 0.07 s longer).
HIDDEN_SLOW_WORKER_ARGS = ("--hogs", "2", "--hidden", "2560")
NOT_HELPING_SHARE = 0.5
NOT_HELPING_GROUPS = 2
NOT_HELPING_MISSES = 1
NOT_HELPING_P = 0.05
# A planted run may name no slow worker where the books show its fault under the finding's bar.
# The budget's imbalance part is 0.45-0.89x the books' extra wait on the slow worker's batches
# (books_slow_worker_extra_s) over 8 distinct planted runs of this job (2026-12-05 and -06, quiet
# suites); so from 1/0.45 = 2.2 bars of books' extra wait the part clears the bar on every one of
# them. The bar here is MIN_SHARE_OF_JOB of the books' training time; the finding's is of the
# process's span (findings/base.py: from its first event to its last, start-up and the gaps
# between epochs too), a few % longer: with that and the 8 runs' spread, 2.5 bars, not 2.2. The
# one run that named none, in a quiet suite on 2026-12-06, had 1.5 bars (0.18 s of extra wait, a
# part of 0.116 s against a bar of 0.121 s); the others 2.1-8.0 bars.
HIDDEN_UNDER_BAR_BARS = 2.5

# Findings per scenario: the one its planted cause must produce, and ones that would be wrong.
EXPECTED = {"latency": "more_workers", "cpu": "cpu_saturated", "slow_worker": "slow_worker",
            "startup": "persistent_workers", "contention": "host_contention"}
WRONG = {
    # latency: storage-like sleeps, alike workers, persistent: not a slow worker, not the CPU, not start-up.
    "latency": {"slow_worker", "cpu_saturated", "persistent_workers", "use_workers"},
    # cpu: more workers would not help (the finding is cpu_saturated instead), nothing else is wrong.
    "cpu": {"more_workers", "slow_worker", "persistent_workers", "use_workers", "storage_bound"},
    # slow_worker: sleeps (no CPU), persistent workers, workers already.
    "slow_worker": {"cpu_saturated", "persistent_workers", "use_workers"},
    # startup: alike fast workers; the steady wait is the per-batch delivery cost only.
    "startup": {"slow_worker", "more_workers", "cpu_saturated", "use_workers"},
    # contention: fast workers (clean's) on a host other processes keep busy: no DataLoader fault.
    "contention": {"more_workers", "cpu_saturated", "slow_worker", "slow_samples", "persistent_workers",
                   "use_workers", "storage_bound"},
}
# The largest part of the wait budget for each planted cause, and its bound where it has one.
LARGEST_PART = {"latency": ("throughput", "latency"), "cpu": ("throughput", "cpu"),
                "slow_worker": ("imbalance", None), "startup": ("startup", None), "contention": ("contention", None)}
SCENARIOS = ["latency", "cpu", "slow_worker", "startup", "clean", "pairing", "contention"]


# --- running the job ---------------------------------------------------------------------------

def other_runnable() -> float:
    """The host's runnable tasks besides this one, averaged over PROBE_S (see STEADY_OTHERS)."""
    counts = []
    end = time.perf_counter() + PROBE_S
    while time.perf_counter() < end:
        with open("/proc/stat", "rb") as stat:
            running = next(line for line in stat if line.startswith(b"procs_running "))
        counts.append(int(running.split()[1]) - 1)
        time.sleep(PROBE_EVERY_S)
    return sum(counts) / len(counts)


def cpu_times() -> tuple[int, int, int]:
    """(steal, busy, all) jiffies of the host's cores so far (/proc/stat's first line; busy is
    user, nice, system, irq and softirq)."""
    with open("/proc/stat", "rb") as stat:
        fields = [int(value) for value in stat.readline().split()[1:]]
    fields += [0] * (8 - len(fields))
    return fields[7], sum(fields[:3]) + fields[5] + fields[6], sum(fields[:8])


def children_cpu_s() -> float:
    """CPU seconds of this process's waited-for descendants so far (a job's workers and busy
    processes count once the job has waited for them and the test for the job)."""
    times = os.times()
    return times.children_user + times.children_system


class Run:
    """One run of the job: its books, its trial folder, the analysis of that trial, and the
    host's other load just before and just after it (`others`)."""

    def __init__(self, folder, fault: str, change: dict | None, more_args: tuple = ()):
        self.folder, self.fault, self.change, self.more_args = folder, fault, dict(change or {}), tuple(more_args)
        self.trial = str(folder / "trial")
        books_path = folder / "books.json"
        command = [sys.executable, JOB, "--out", self.trial, "--books", str(books_path), "--fault", fault,
                   *switches(self.change), *more_args]
        env = dict(os.environ)
        env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
        for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "GROUP_RANK", "NODE_RANK", "SM_CURRENT_HOST"):
            env.pop(key, None)
        # Output to files, not pipes (worker processes of a crashed job would hold pipes open).
        self.others = [other_runnable()]
        steal_before, busy_before, all_before = cpu_times()
        job_cpu_before, started = children_cpu_s(), time.perf_counter()
        with open(folder / "stdout.txt", "w") as stdout, open(folder / "stderr.txt", "w") as stderr:
            done = subprocess.run(command, cwd=str(folder), env=env, stdout=stdout, stderr=stderr, timeout=240)
        steal_after, busy_after, all_after = cpu_times()
        self.stolen = (steal_after - steal_before) / max(all_after - all_before, 1)  # see STOLEN_LOADED
        # The cores that processes other than the job (and its own) kept busy while it ran: see OTHERS_CORES_LOADED.
        job_cpu = children_cpu_s() - job_cpu_before
        self.others_cores = ((busy_after - busy_before) / CLOCK_TICKS - job_cpu) / (time.perf_counter() - started)
        self.others.append(other_runnable())
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


def steady_books(run: Run) -> tuple[float, float]:
    """The books' steady wait (each epoch's batches after its first round) and, of it, the
    hand-over of batches their workers had finished."""
    settings = run.books["settings"]
    first_round = max(settings["num_workers"], 1)
    steady = [i % settings["batches"] >= first_round for i in range(run.books["batches"])]
    waits = sum(w for w, keep in zip(run.books["waits_s"], steady) if keep)
    return waits, sum(h for h, keep in zip(run.books["handovers_s"], steady) if keep)


def books_slow_worker_extra_s(run: Run) -> float:
    """The books' steady wait on the slow worker's batches beyond what as many of the other
    workers' batches waited (their mean). In order, batch i of an epoch comes from worker
    i % num_workers (torch's _reset starts each epoch's round robin at worker 0)."""
    settings = run.books["settings"]
    assert settings["in_order"], settings  # (out of order, a worker's batches are not i % num_workers)
    workers, per_epoch, slow = settings["num_workers"], settings["batches"], settings["slow_worker_id"]
    steady = [(i % per_epoch, wait) for i, wait in enumerate(run.books["waits_s"]) if i % per_epoch >= workers]
    slow_waits = [wait for i, wait in steady if i % workers == slow]
    other_waits = [wait for i, wait in steady if i % workers != slow]
    return sum(slow_waits) - len(slow_waits) * statistics.mean(other_waits)


def others_busy(run: Run) -> bool:
    """Whether other processes of this machine ran beside the job (see STEADY_OTHERS and
    OTHERS_CORES_LOADED)."""
    return max(run.others) > STEADY_OTHERS or run.others_cores > OTHERS_CORES_LOADED


def host_was_loaded(run: Run) -> bool:
    return others_busy(run) or run.stolen > STOLEN_LOADED


def skip_if_host_was_loaded(runs: list[Run], why: str) -> None:
    """Skips the rest of a test whose measure holds only on a quiet host (`why` says why),
    when any of its runs saw other load, saying what load."""
    loaded = [run for run in runs if host_was_loaded(run)]
    if loaded:
        pytest.skip(f"the host had other load ({[(run.others, round(run.others_cores, 2)) for run in loaded]} "
                    f"runnable tasks besides the test's and cores other processes used, "
                    f"{max(run.stolen for run in loaded):.1%} of the cores stolen): {why}")


def displaced(run: Run) -> bool:
    """Whether the host's other load, not the planted cause, is what the job mostly waited
    for (see HANDOVER_DISPLACES)."""
    _, handovers = steady_books(run)
    computing = run.books["settings"]["spin"] > 0
    return host_was_loaded(run) and not computing and handovers > HANDOVER_DISPLACES * run.books["wait_s"]


def wait_tolerance_s(run: Run) -> float:
    return WAIT_TOLERANCE_PER_BATCH_S * run.books["batches"]


def training_tolerance_s(run: Run) -> float:
    return TRAINING_TOLERANCE_PER_EPOCH_S * run.books["epochs"]


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

    def run(self, fault: str, change: dict | None = None, more_args: tuple = ()) -> Run:
        name = "-".join(f"{k}-{v}" for k, v in (change or {}).items()) or "planted"
        return Run(self.factory.mktemp(f"{fault}-{name}"), fault, change, more_args)

    def steady(self, fault: str, *asks, more_args: tuple = ()) -> list[Run]:
        """A run of the planted job (with `more_args`), then a run for each of `asks` (given
        that run, the change and more arguments of a run to make after it), all made now and
        on one host load (see STEADY_OTHERS). The steal of the hypervisor's other guests is
        compared between the means of the runs like the first and of those with a change (of
        a setting, or of the job's arguments: the hand-over and contention tests change only
        those), as the tests compare them (see STOLEN_LOADED). The module's shared planted run
        is not one of them: it was made minutes before, on a host whose speed may have moved
        since (see 'one stretch of time')."""
        seen = []
        for _ in range(STEADY_ATTEMPTS):
            planted = self.run(fault, None, more_args)
            runs = [planted] + [self.run(fault, *ask(planted)) for ask in asks]
            probes = [p for run in runs for p in run.others]
            like_first = [not run.change and run.more_args == planted.more_args for run in runs]
            today = [run.stolen for run, alike in zip(runs, like_first) if alike]
            changed = [run.stolen for run, alike in zip(runs, like_first) if not alike]
            stolen_apart = (abs(statistics.mean(today) - statistics.mean(changed)) if today and changed
                            else max(today + changed) - min(today + changed))
            busy = {others_busy(run) for run in runs}
            if max(probes) - min(probes) <= STEADY_OTHERS and stolen_apart <= STOLEN_LOADED and len(busy) == 1:
                return runs
            seen.append([[round(p, 2) for p in run.others] + [f"stolen {run.stolen:.1%}", f"others {run.others_cores:.2f} cores"]
                         for run in runs])
        pytest.fail(f"the host's other load changed between the runs of each of {STEADY_ATTEMPTS} attempts "
                    f"(runnable tasks besides the test's, before and after each run, the share of the cores "
                    f"stolen by the hypervisor during it, and the cores other processes used during it: {seen}): a prediction "
                    "cannot be checked against a re-run on a different load (see STEADY_OTHERS)")


def again(planted: Run) -> tuple:
    """For Jobs.steady: the planted run once more (with its arguments)."""
    return None, planted.more_args


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
    run = jobs.planted(fault)
    budget = only_budget(run)
    largest = max(budget.parts, key=budget.parts.get)
    # Hand-overs are measured (the collector's fetch events), so none of them is left in the
    # residual: only the books' other steady waiting can be. (The cpu job's residual, before
    # the budget credited them, was 0-0.50 s of its 1 s of steady hand-over, once the largest
    # part; after, 0.000-0.011 s over 40 runs of every fault.)
    waits, handovers = steady_books(run)
    assert budget.parts["residual"] <= waits - handovers + wait_tolerance_s(run), (budget.parts, waits, handovers)
    if displaced(run):
        # Hand-over is the contention part beyond an uncontended one, the rest delivery
        # (throughput's); on a saturated host the uncontended one read from the batches holds
        # some queueing too (budget.FIRST_MODE_QUANTILE): with four `yes` the latency
        # job's contention and throughput parts were 0.55-0.6 s and 0.65-0.9 s.
        assert largest in ("contention", "throughput"), (budget.parts, steady_books(run))
        return
    part, bound = LARGEST_PART[fault]
    assert largest == part, budget.parts
    if bound is not None:
        assert budget.bound == bound, (budget.bound, budget.parts)


# --- the findings --------------------------------------------------------------------------------

@pytest.mark.parametrize("fault", sorted(EXPECTED))
def test_the_planted_cause_is_found_and_no_wrong_cause(jobs, fault):
    run = jobs.planted(fault)
    found = ids(run.result)
    assert (EXPECTED[fault] if not displaced(run) else "host_contention") in found, (found, steady_books(run))
    assert not WRONG[fault] & set(found), found
    if run.books["settings"]["persistent"]:
        assert "persistent_workers" not in found
    if fault == "slow_worker":
        assert finding(run.result, "slow_worker").evidence["worker_id"] == run.books["settings"]["slow_worker_id"]


def test_a_clean_job_gets_no_findings(jobs):
    run = jobs.planted("clean")
    found = [(r.id, r.text) for r in run.result.recommendations]
    if host_was_loaded(run):  # the host's other processes: no fault of its DataLoader
        assert {rid for rid, _ in found} <= {"host_contention"}, found
    else:
        assert found == [], (found, run.others)


def test_host_contention_is_the_hand_over_that_the_other_processes_cost(jobs):
    def without_them(planted):
        return None, ("--hogs", "0")

    # Means of runs in CONTENTION_GROUPS groups A B B A (see 'means of runs' among the tolerances), on one host load.
    groups = [without_them, without_them, again, again] * CONTENTION_GROUPS
    runs = jobs.steady("contention", *groups[:-1])
    beside = [run for run in runs if run.books["settings"]["hogs"]]
    alone = [run for run in runs if not run.books["settings"]["hogs"]]
    assert len(beside) == len(alone) == 2 * CONTENTION_GROUPS
    for run in beside:
        named = finding(run.result, "host_contention")
        part = only_budget(run).parts["contention"]
        _, handovers = steady_books(run)
        assert CONTENTION_OF_HANDOVER_MIN * handovers <= part <= handovers + wait_tolerance_s(run), (part, handovers)
        assert named.saving_s == pytest.approx(part, abs=1e-3) and named.change is None, named
    mean = statistics.mean
    predicted = mean(finding(run.result, "host_contention").saving_s for run in beside)
    removed = mean(run.books["wait_s"] for run in beside) - mean(run.books["wait_s"] for run in alone)
    books = {"beside": [(run.books["wait_s"], run.books["training_s"]) for run in beside],
             "alone": [(run.books["wait_s"], run.books["training_s"]) for run in alone]}
    assert removed > 0, books
    # The host's other load stays for the re-run, and with it part of the contention: the
    # saving, which is that of all other processes, is not what removing the job's two is.
    skip_if_host_was_loaded(beside + alone, "the saving of removing all of it cannot be measured by removing "
                                            "the job's own two")
    assert predicted == pytest.approx(removed, rel=CONTENTION_SAVING_TOLERANCE), str((predicted, removed, books))
    for run in alone:
        assert "host_contention" not in ids(run.result), ids(run.result)
    throughput = {way: mean(only_budget(run).parts["throughput"] for run in runs)
                  for way, runs in (("beside", beside), ("alone", alone))}
    assert throughput["beside"] == pytest.approx(throughput["alone"], rel=CONTENTION_THROUGHPUT_TOLERANCE), (
        throughput, [only_budget(run).parts for run in beside + alone])


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
    if displaced(jobs.planted(fault)):
        pytest.skip(f"{fault}: most of the steady wait was finished batches' hand-over on a loaded host "
                    f"(books: {steady_books(jobs.planted(fault))}); the planted cause's fix is not what it waits for")
    recommendation = finding(jobs.planted(fault).result, EXPECTED[fault])
    if recommendation.change is None:
        # Only slow_worker's may propose no change: where out-of-order delivery is predicted to save
        # less than a finding must be worth (a loaded suite run: predicted 5.08 s -> 6.44 s, the re-run
        # trained 5.31 s).
        assert fault == "slow_worker", fault
        pytest.skip(f"{fault}: the finding proposes no change on this host (in_order=False predicted "
                    f"{recommendation.evidence['in_order_false_predicted']})")
    change, predicted = recommendation.change, recommendation.predicted
    assert isinstance(change, dict) and change, change
    assert predicted is not None and set(predicted) >= {"wait_fraction", "training_s"}, predicted

    def fixed(planted):
        return change, ()

    # Means of runs in the order A B B A (see 'means of runs' among the tolerances), on one host load.
    planted, *with_fix, last = jobs.steady(fault, fixed, fixed, again)
    # The what-if of the same change starts from today's books.
    for today in (planted, last):
        (what_if,) = today.result.what_if(change)
        assert what_if.change == change
        assert what_if.now["wait_fraction"] == pytest.approx(today.wait_fraction, abs=fraction_tolerance(today))
        assert what_if.now["training_s"] == pytest.approx(today.books["training_s"], abs=training_tolerance_s(today))
    # The finding's prediction is the what-if of its change (on the run it was made from).
    assert jobs.planted(fault).result.what_if(change)[0].predicted == predicted
    compared = ab_means([planted, last], with_fix, change)
    planted_s, fixed_s, predicted_s = compared["today_s"], compared["fixed_s"], compared["predicted_s"]
    shown = str(compared)  # (a str, which pytest shows whole: it cuts a dict's repr short)
    assert abs(predicted_s - fixed_s) < abs(planted_s - fixed_s), (
        f"the re-runs with {change} trained {fixed_s:.2f} s against the planted runs' {planted_s:.2f} s (means): "
        f"the prediction ({predicted_s:.2f} s) is no nearer to it than 'nothing changes': {shown}")
    assert compared["predicted_fraction"] == pytest.approx(compared["fixed_fraction"], abs=WAIT_FRACTION_TOLERANCE), (
        shown)
    assert predicted_s == pytest.approx(fixed_s, rel=TRAINING_RELATIVE_TOLERANCE), shown


def test_a_slow_worker_made_as_fast_as_the_others_saves_what_its_finding_predicts(jobs):
    """The slow_worker finding's first change is in the Dataset, not in a setting: the worker made
    as fast as the others. Its prediction (evidence `fixed_worker_predicted`, in the text) is
    checked as the settings' are, against re-runs with the worker fixed (--slow-factor 1)."""
    def as_fast(planted):
        return None, ("--slow-factor", "1")

    # Means of runs in the order A B B A (see 'means of runs' among the tolerances), on one host load.
    # Measured (the module's table): training 0.98-1.18x the re-runs', waiting share within 0.07.
    # Since each next() whose batch is there is charged its own cost (pipeline._delivery_by_path) and
    # the step after a long wait its idle compute (pipeline._idle_compute), 10 groups (2026-12-06, 6
    # quiet, 4 with two `yes`): training 0.90-1.28x, waiting share 0.02-0.08 under (the planted runs'
    # loop computed slower between its waits). Without either, a CI run whose first planted run met a
    # busier host (its waited-for next()s took 7 ms) missed by 1.68x.
    planted, *fixed, last = jobs.steady("slow_worker", as_fast, as_fast, again)
    predictions = []
    for run in (planted, last):
        found = finding(run.result, "slow_worker")
        predicted = found.evidence["fixed_worker_predicted"]
        assert f"training {duration_s(run.result.budget[0].training_s)} -> {duration_s(predicted['training_s'])}" in (
            found.text), found.text
        predictions.append(predicted)
    mean = statistics.mean
    planted_s = mean(run.books["training_s"] for run in (planted, last))
    fixed_s = mean(run.books["training_s"] for run in fixed)
    predicted_s = mean(p["training_s"] for p in predictions)
    shown = str({"planted_s": planted_s, "fixed_s": fixed_s, "predicted_s": predicted_s, "predicted": predictions,
                 "books": [(run.books["wait_s"], run.books["training_s"]) for run in (planted, *fixed, last)]})
    assert abs(predicted_s - fixed_s) < abs(planted_s - fixed_s), shown
    assert mean(p["wait_fraction"] for p in predictions) == pytest.approx(
        mean(run.wait_fraction for run in fixed), abs=WAIT_FRACTION_TOLERANCE), shown
    assert predicted_s == pytest.approx(fixed_s, rel=TRAINING_RELATIVE_TOLERANCE), shown
    # `compare` A B, no setting changed: it compares B with A's prediction for the worker B no
    # longer has slow, and says so.
    from dashboard.api import compare
    from dashboard.report import compare_text

    comparison = compare(planted.result, fixed[0].result)
    assert "slow_worker" not in ids(fixed[0].result), ids(fixed[0].result)
    assert comparison.settings_changed == [], comparison.settings_changed
    assert comparison.predicted["change"] == {}, comparison.predicted
    assert [(fix["finding"], fix["worker_id"]) for fix in comparison.predicted["fixes"]] == [
        ("slow_worker", planted.books["settings"]["slow_worker_id"])], comparison.predicted
    assert comparison.predicted["training_s"] == pytest.approx(predictions[0]["training_s"], abs=1e-6)
    assert comparison.achieved["training_s"] == pytest.approx(fixed[0].books["training_s"],
                                                              abs=training_tolerance_s(fixed[0]))
    assert (f"Predicted by A's slow_worker prediction (worker {planted.books['settings']['slow_worker_id']} of "
            in compare_text(planted.result, fixed[0].result, comparison))


def ab_means(today: list[Run], changed: list[Run], change: dict) -> dict:
    """Means over runs made in the order A B B A: today's runs' books and their predictions of
    `change`, and the books of the runs with it."""
    predictions = [run.result.what_if(change)[0].predicted for run in today]
    mean = statistics.mean
    return {"today_s": mean(run.books["training_s"] for run in today),
            "fixed_s": mean(run.books["training_s"] for run in changed),
            "predicted_s": mean(p["training_s"] for p in predictions),
            "fixed_wait_s": mean(run.books["wait_s"] for run in changed),
            "predicted_wait_s": mean(p["wait_fraction"] * p["training_s"] for p in predictions),
            "fixed_fraction": mean(run.wait_fraction for run in changed),
            "predicted_fraction": mean(p["wait_fraction"] for p in predictions),
            "books": {"today": [(run.books["wait_s"], run.books["training_s"]) for run in today],
                      "changed": [(run.books["wait_s"], run.books["training_s"]) for run in changed]},
            "predicted": predictions}


def gain_is_clear(slower: list[Run], faster: list[Run], margin_s: float) -> bool:
    """Whether the runs show the faster ones training more than margin_s faster than the slower
    ones: a one-sided Welch t-test of their training times (see NOT_HELPING_P)."""
    from scipy import stats

    test = stats.ttest_ind([run.books["training_s"] for run in slower],
                           [run.books["training_s"] + margin_s for run in faster], equal_var=False,
                           alternative="greater")
    return bool(test.pvalue < NOT_HELPING_P)


def test_out_of_order_delivery_is_proposed_where_the_re_runs_gain_and_only_there(jobs):
    def out_of_order(planted):
        return {"in_order": False}, HIDDEN_SLOW_WORKER_ARGS

    # Means of runs in NOT_HELPING_GROUPS groups A B B A (see 'means of runs' among the tolerances), on one host load.
    groups = [out_of_order, out_of_order, again, again] * NOT_HELPING_GROUPS
    runs = jobs.steady("slow_worker", *groups[:-1], more_args=HIDDEN_SLOW_WORKER_ARGS)
    today = [run for run in runs if not run.change]
    changed = [run for run in runs if run.change]
    assert len(today) == len(changed) == 2 * NOT_HELPING_GROUPS
    named = []
    for run in today:
        bars = books_slow_worker_extra_s(run) / (MIN_SHARE_OF_JOB * run.books["training_s"])
        if "slow_worker" not in ids(run.result) and (host_was_loaded(run) or bars < HIDDEN_UNDER_BAR_BARS):
            # Other load hides the slow worker further (see NOT_HELPING_SHARE), or the books show
            # its fault near the finding's bar (see HIDDEN_UNDER_BAR_BARS).
            print(f"no slow worker named: {bars:.2f} bars of books' extra wait, loaded {host_was_loaded(run)}")
            continue
        found = finding(run.result, "slow_worker")
        assert found.evidence["worker_id"] == run.books["settings"]["slow_worker_id"], found.evidence
        assert found.change in (None, {"in_order": False}), found.change
        assert (found.change is None) == ("would not help" in found.text), found.text
        named.append(found)
    # Not all excused on a quiet host: the test would then check no finding at all (the 8 runs
    # above had 1.5-8.0 bars, one under HIDDEN_UNDER_BAR_BARS).
    assert named or any(host_was_loaded(run) for run in today), "no planted run named the slow worker on a quiet host"
    compared = ab_means(today, changed, {"in_order": False})
    imbalance = statistics.mean(only_budget(run).parts["imbalance"] for run in today)
    removed = statistics.mean(run.books["wait_s"] for run in today) - compared["fixed_wait_s"]
    gain = compared["today_s"] - compared["fixed_s"]
    bar = MIN_SHARE_OF_JOB * compared["today_s"]
    proposed = sum(found.change is not None for found in named)
    shown = str({"gain_s": gain, "bar_s": bar, "proposed": f"{proposed} of {len(named)}",
                 "imbalance_s": imbalance, "removed_s": removed, **compared})
    print(f"out of order: {shown}")
    if gain >= 2 * bar and gain_is_clear(today, changed, 2 * bar):
        assert proposed >= len(named) - NOT_HELPING_MISSES, shown
    if gain <= -bar and gain_is_clear(changed, today, bar):
        claimed = [found.text for found in named
                   if found.change is not None and imbalance_finding.CANNOT_TELL not in found.text]
        assert not claimed, (shown, claimed)
    # The training time the text names for the change holds as the other predictions do.
    assert compared["predicted_fraction"] == pytest.approx(compared["fixed_fraction"], abs=WAIT_FRACTION_TOLERANCE), (
        shown)
    assert compared["predicted_s"] == pytest.approx(compared["fixed_s"], rel=TRAINING_RELATIVE_TOLERANCE), shown
    if proposed == 0:
        skip_if_host_was_loaded(runs, f"the waits' noise is then as large as the slow worker's part "
                                      f"(see NOT_HELPING_SHARE): {shown}")
        assert removed < NOT_HELPING_SHARE * imbalance, shown


def test_cheaper_samples_shorten_the_hand_over_the_cpu_finding_names(jobs):
    def cheaper(planted):
        return None, ("--spin", HANDOFF_CHEAPER_SPIN)

    # In groups A B B A: the host's load drifts.
    planted, *more = jobs.steady("cpu", *([cheaper, cheaper, again, again] * (HANDOFF_RUNS // 2))[:-1])
    named = finding(planted.result, "cpu_saturated")
    assert named.evidence["handoff_s"] is not None and "handed over" in named.text, named.text
    runs = {"planted": [planted] + [run for run in more if run.more_args == planted.more_args],
            "cheaper": [run for run in more if run.more_args != planted.more_args]}
    assert len(runs["planted"]) == len(runs["cheaper"]) == HANDOFF_RUNS
    handoffs = {way: [only_budget(run).evidence["handoff_s"] for run in done] for way, done in runs.items()}
    mean = {way: sum(values) / len(values) for way, values in handoffs.items()}
    assert mean["cheaper"] <= HANDOFF_RATIO_MAX * mean["planted"], handoffs
    # Most of a ready batch's wait is the hand-over the finding names; the rest is delivery
    # itself, which the bar for the finding sets aside (see HANDOFF_SHARE_MIN).
    for run in runs["planted"]:
        evidence = only_budget(run).evidence
        assert evidence["handoff_s"] >= HANDOFF_SHARE_MIN * evidence["delivery_s"], evidence


def test_more_workers_gain_what_the_model_predicts_when_the_cores_are_saturated(jobs):
    def doubled_workers(planted):
        return {"num_workers": 2 * planted.books["settings"]["num_workers"]}, ()

    # Measured on means of runs in CPU_GAIN_GROUPS groups A B B A, on one host load (see CPU_GAIN_TOLERANCE).
    runs = jobs.steady("cpu", *([doubled_workers, doubled_workers, again, again] * CPU_GAIN_GROUPS)[:-1])
    planted = runs[0]
    today = [run for run in runs if not run.change]
    doubled = [run for run in runs if run.change]
    assert len(today) == len(doubled) == 2 * CPU_GAIN_GROUPS
    change = doubled[0].change
    (what_if,) = planted.result.what_if(change)
    assert what_if.change == change
    assert what_if.predicted is not None
    assert what_if.now["wait_fraction"] == pytest.approx(planted.wait_fraction, abs=fraction_tolerance(planted))
    assert what_if.now["training_s"] == pytest.approx(planted.books["training_s"], abs=training_tolerance_s(planted))

    predictions = [run.result.what_if(change)[0] for run in today]
    predicted_gain = statistics.mean(1 - p.predicted["training_s"] / p.now["training_s"] for p in predictions)
    today_s = statistics.mean(run.books["training_s"] for run in today)
    doubled_s = statistics.mean(run.books["training_s"] for run in doubled)
    measured_gain = 1 - doubled_s / today_s
    trained = {"today": [run.books["training_s"] for run in today],
               "doubled": [run.books["training_s"] for run in doubled]}
    print(f"doubling the workers: predicted {predicted_gain:+.3f}, measured {measured_gain:+.3f} ({trained})")
    assert predicted_gain == pytest.approx(measured_gain, abs=CPU_GAIN_TOLERANCE), (predictions, trained)

    # The JSON form of the what-ifs: the contract's keys, today's numbers as what_if() has them.
    for item in planted.result.to_dict()["what_if"]:
        assert {"node", "loader", "change", "now", "predicted"} <= set(item)
        if (item["node"], item["loader"]) == (what_if.node, what_if.loader):
            assert item["now"] == pytest.approx(what_if.now)


def test_a_killed_job_takes_its_busy_processes_with_it(tmp_path):
    # A suite stopped with SIGTERM left a job's two busy processes running: both cores stayed busy
    # through the next suite. Killed even with SIGKILL, the job's busy processes end with it.
    job = subprocess.Popen([sys.executable, JOB, "--out", str(tmp_path / "trial"), "--books", str(tmp_path / "b.json"),
                            "--fault", "clean", "--hogs", "2", "--epochs", "50"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def hogs() -> list[int]:
        found = []
        for pid in os.listdir("/proc"):
            try:
                with open(f"/proc/{pid}/stat") as handle:
                    parent = int(handle.read().rsplit(")", 1)[1].split()[1])
                with open(f"/proc/{pid}/cmdline", "rb") as handle:
                    busy = b"while True: pass" in handle.read()
            except (OSError, ValueError, IndexError):
                continue
            if busy and parent == job.pid:
                found.append(int(pid))
        return found

    deadline = time.monotonic() + 60
    while len(hogs()) < 2 and job.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    started = hogs()
    job.kill()
    job.wait()
    assert len(started) == 2, started
    deadline = time.monotonic() + 10
    while any(os.path.exists(f"/proc/{pid}") and _running(pid) for pid in started) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [pid for pid in started if os.path.exists(f"/proc/{pid}") and _running(pid)], started


def _running(pid: int) -> bool:
    """Whether a process is alive (not a zombie its parent has yet to reap)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
