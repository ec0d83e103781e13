"""The modern API: load a trial, analyze it, get typed results.

    >>> import dashboard
    >>> trial = dashboard.load_trial("s3://bucket/job/profiler-output")
    >>> result = dashboard.analyze(trial)
    >>> result.getnext.median_us, result.getnext.outliers
    >>> result.to_dict()          # the `app.py analyze --json` object
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from .analysis import dataloader
from .analysis import diagnosis
from .analysis.dataloader import DEFAULT_OUTLIER_FACTOR, DataLoaderAnalysis, Window
from .trial.errors import TrialError
from .trial.load import Trial, load_trial


@dataclass
class TrialAnalysis:
    """A trial and every analysis of it."""
    trial: Trial
    dataloader: DataLoaderAnalysis
    node: str | None = None  # the host or process it is scoped to (None: the job)
    rank: int | None = None
    # The GetNexts' iterators (analysis.dataloader.call_segments), found once for the batch
    # times and the assessment (0.6 s at 3M GetNexts), kept for the assessment until it is
    # computed (then let go: 72 MB at 3M). An analysis is of the frames as they were when
    # analyze() ran.
    found: dataloader.CallSegments | None = field(default=None, repr=False)

    @property
    def initialization(self):
        return self.dataloader.initialization

    @property
    def workers(self):
        return self.dataloader.workers

    @property
    def getnext(self):
        return self.dataloader.getnext

    @property
    def batchtime(self):
        return self.dataloader.batchtime

    @cached_property
    def assessment(self) -> diagnosis.Assessment:
        """Input-bound verdict (trial, per host, per process), wait budgets and
        recommendations, computed once."""
        found, self.found = self.found, None
        return diagnosis.assess(self.trial.framework, self.trial.system, self.dataloader.outlier_factor, found)

    @property
    def verdict(self) -> diagnosis.Verdict:
        return self.assessment.verdict

    @property
    def nodes_verdict(self) -> dict[str, diagnosis.Verdict]:
        return self.assessment.nodes_verdict

    @property
    def processes_verdict(self) -> dict[str, diagnosis.Verdict]:
        return self.assessment.processes_verdict

    @property
    def recommendations(self) -> list[diagnosis.Recommendation]:
        return self.assessment.recommendations

    @property
    def budget(self) -> list[diagnosis.LoaderBudget]:
        """Per training loader per process: where its wait went, in parts that add up."""
        return self.assessment.budget

    def what_if(self, change: dict | str) -> list[diagnosis.WhatIf]:
        """Predicted wait fraction and training time with changed DataLoader settings, per
        training loader: {"num_workers": 8} or "num_workers=8,in_order=false"."""
        if isinstance(change, str):
            change = diagnosis.parse_what_if(change)
        return self.assessment.predict(change)

    def window(self, start_us=None, end_us=None, select_events=(".*",),
               select_dimensions=(".*",)) -> Window:
        return dataloader.window(self.trial.framework, self.trial.system, start_us, end_us,
                                 select_events, select_dimensions)

    def to_dict(self) -> dict:
        from .report import to_dict

        return to_dict(self)


def analyze(trial: Trial | str, *, node: str | None = None, rank: int | None = None,
            outlier_factor: float = DEFAULT_OUTLIER_FACTOR, assess: bool = False, events: bool = True,
            **load_options) -> TrialAnalysis:
    """Analyze a trial (a loaded Trial or a path, read with `load_trial(path, **load_options)`),
    or the part of it on one host or process (`node`: a host or a process id) or of one `rank`.

    assess: compute the assessment (verdict, budget, findings) now, before the panels'
    analyses, for a caller that will ask for it anyway (`app.py analyze`). Its working memory is
    then freed before the analyses hold their copies of the events: the whole `analyze --json`
    of a 300k-GetNext trial peaked at 320 MB computing it after them, 268 MB before.
    events=False: the panels' frames of every event (`getnext.events`, `batchtime.batches`, ...)
    come back empty, with their columns, for a caller that reads only their numbers and
    outliers (`app.py analyze`: 3M GetNexts' copies were 400 MB of its peak)."""
    outlier_factor = dataloader.checked_outlier_factor(outlier_factor)
    if isinstance(trial, str):
        trial = load_trial(trial, **load_options)
    part = trial.for_node(node, rank)
    found = dataloader.call_segments(part.framework)
    assessment = diagnosis.assess(part.framework, part.system, outlier_factor, found) if assess else None
    analysis = dataloader.analyze(part.framework, outlier_factor, found, events)
    result = TrialAnalysis(trial=part, dataloader=analysis, node=node, rank=rank, found=None if assess else found)
    if assessment is not None:
        result.__dict__["assessment"] = assessment  # where the cached_property keeps its value
    return result


def compare(a: TrialAnalysis | Trial | str, b: TrialAnalysis | Trial | str, **load_options):
    """Run B against run A (A: before the change): the deltas, the settings that changed, the
    findings resolved, remaining or new, and A's what-if for B's settings against what B
    measured (dashboard.analysis.compare.Comparison). `report.compare_dict` is its JSON."""
    from .analysis.compare import Side, compare as compare_sides

    a, b = (item if isinstance(item, TrialAnalysis) else analyze(item, **load_options) for item in (a, b))
    for item in (a, b):
        if not isinstance(item.trial, Trial):  # dashboard.by_rank's: its events stayed with the workers
            raise TrialError(f"{item.trial.path}: analyzed by rank, without its events: compare needs them "
                             "(dashboard.analyze)")
    return compare_sides(Side(a.assessment, a.trial.framework), Side(b.assessment, b.trial.framework))
