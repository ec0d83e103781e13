"""Loads a trial with its files parsed in forked worker processes (load.ForkedWorkers), whatever
its size, and prints what the load kept as JSON: the tests compare it with a load in one
process. Run as a script, in a process of its own: forking needs a process without threads,
which a test session (S3 server, browsers) is not.

    python tests/forked_load.py TRIAL
    python tests/forked_load.py --by-rank TRIAL      (dashboard/by_rank.py's tasks, forked)
    python tests/forked_load.py --web TRIAL CACHE    (the dashboard's background load: TrialCache.load,
                                                      with as many processes as cores)
"""
from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dashboard.trial import load  # noqa: E402


def kept(trial) -> dict:
    """A load's events, system samples and report, in a form JSON keeps exactly."""
    fw, report = trial.framework, trial.report
    return {
        "events": sorted(zip(fw["process"].astype(str), fw["name"].astype(str), fw["start_us"].tolist(),
                             fw["end_us"].tolist())),
        "system": len(trial.system),
        "files_read": report.files_read,
        "lines_skipped": report.lines_skipped,
        "values_ignored": report.values_ignored,
        "files_skipped": sorted((s.path, s.reason) for s in report.files_skipped),
        "files_with_skipped_lines": sorted((s.path, s.reason) for s in report.files_with_skipped_lines),
    }


def main() -> int:
    load.PROCESS_PARSE_MIN_BYTES = 0
    forked = []
    original = load.ForkedWorkers.__init__

    def counting(self, processes):
        forked.append(processes)
        original(self, processes)

    load.ForkedWorkers.__init__ = counting
    if sys.argv[1] == "--by-rank":  # the whole analysis, each rank a task of a forked worker
        from dashboard.by_rank import analyze_by_rank
        from dashboard.report import to_dict

        report = to_dict(analyze_by_rank(sys.argv[2], processes=2))
        print(json.dumps({"forked": forked, "report": report}))
        return 0
    if sys.argv[1] == "--web":  # as a background load runs, in a process of its own
        from dashboard.web.cache import TrialCache

        _, trial, _ = TrialCache(sys.argv[3]).load(sys.argv[2])
        print(json.dumps({"forked": forked, **kept(trial)}))
        return 0
    trial = load.load_trial(sys.argv[1], processes=2)
    print(json.dumps({"forked": forked, **kept(trial)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
