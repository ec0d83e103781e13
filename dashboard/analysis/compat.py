"""The reference's names (`PandasFrame`, `PT_dataloader_analysis`), so notebooks written for
SageMaker Debugger run unchanged, computed by this project's reader and analyses.

Differences from the reference, all deliberate: every event is kept (nothing is dropped
before the first system-metrics file); times in `*_us` columns are absolute epoch
microseconds; each analysis returns a DataFrame (empty when there is nothing to show)
instead of None; batch time never spans iterators; `plot_the_window` returns a plotly
figure (no notebook kernel, no Bokeh).
"""
from __future__ import annotations

import re
from datetime import datetime, timezone
from typing import Sequence

import pandas as pd

from ..trial.load import Trial, load_trial
from . import dataloader

REFERENCE_TIME_FORMAT = "%Y-%m-%dT%H:%M:%S:%f"


def _human(us: pd.Series) -> pd.Series:
    """Epoch microseconds as the reference's human-readable UTC strings."""
    return pd.to_datetime(us.astype("int64"), unit="us", utc=True).dt.strftime(REFERENCE_TIME_FORMAT)


def to_epoch_us(value) -> int | None:
    """A time given as epoch us/s, datetime, Timestamp, ISO-8601 or the reference's format."""
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return int(value * 1e6) if value < 1e11 else int(value)  # seconds or microseconds
    if isinstance(value, str):
        value = value.strip()
        if re.fullmatch(r"\d+(\.\d+)?", value):
            return to_epoch_us(float(value))
        try:
            stamp = pd.to_datetime(value, format=REFERENCE_TIME_FORMAT, utc=True)
        except ValueError:
            stamp = pd.to_datetime(value, utc=True)
        return int(stamp.value // 1000)
    if isinstance(value, datetime):
        value = value if value.tzinfo else value.replace(tzinfo=timezone.utc)
        return int(pd.Timestamp(value).value // 1000)
    raise TypeError(f"cannot read a time from {value!r}")


def _select(frame: pd.DataFrame, patterns: Sequence[str], columns: Sequence[str]) -> pd.DataFrame:
    if not patterns:
        return frame
    keep = pd.Series(False, index=frame.index)
    for column in columns:
        keep |= dataloader._matches_any(frame[column], list(patterns))
    return frame[keep]


class PandasFrame:
    """A trial as the reference's pandas frames. `path`: local folder or s3://bucket/prefix."""

    def __init__(self, path: str, use_in_memory_cache: bool = False, scan_interval: int = 5_000_000_000,
                 **load_options):
        # use_in_memory_cache and scan_interval are accepted for compatibility: the whole
        # trial is read once, in parallel, and kept.
        self.path = path
        self.trial: Trial = load_trial(path, **load_options)
        report = self.trial.report
        if report.files_skipped or report.lines_skipped or report.values_ignored:
            ignored = f", and read {report.values_ignored} value(s) not of their field's type as missing" \
                if report.values_ignored else ""
            print(f"Skipped {len(report.files_skipped)} file(s) and {report.lines_skipped} line(s) "
                  f"that could not be read{ignored}; see PandasFrame.trial.report")

    def get_all_system_metrics(self, selected_system_metrics: Sequence[str] = ()) -> pd.DataFrame:
        system = self.trial.system
        if selected_system_metrics:
            system = system[system["name"].astype(str).isin(list(selected_system_metrics))]
        return pd.DataFrame({
            "timestamp": _human(system["timestamp_us"]), "timestamp_us": system["timestamp_us"],
            "value": system["value"], "system_metric": system["name"], "dimension": system["dimension"],
            "nodeID": system["node"], "type": system["type"]}).reset_index(drop=True)

    def get_all_framework_metrics(self, selected_framework_metrics: Sequence[str] = ()) -> pd.DataFrame:
        fw = _select(self.trial.framework, selected_framework_metrics, ("name", "phase"))
        return pd.DataFrame({
            "start_time": _human(fw["start_us"]), "end_time": _human(fw["end_us"]),
            "start_time_us": fw["start_us"], "end_time_us": fw["end_us"], "tid": fw["pid"],
            "pid": fw["pid"], "framework_metric": fw["name"], "step": fw["step"].fillna(-1),
            # nodeID as the reference has it: the framework node id (`<pid>-algo-1`, `<rank>-algo-1`)
            "bytes": -1, "process": fw["phase"], "nodeID": fw["process"]}).reset_index(drop=True)

    def get_all_dataloader_metrics(self, selected_framework_metrics: Sequence[str] = ()) -> pd.DataFrame:
        fw = self.trial.framework
        fw = fw[fw["kind"].isin(["init", "getnext", "worker"])]
        fw = _select(fw, selected_framework_metrics, ("name", "phase"))
        pin = fw["pin_memory"].map({True: "True", False: "False"}).astype(object).fillna("NA")
        return pd.DataFrame({
            "start_time": _human(fw["start_us"]), "end_time": _human(fw["end_us"]),
            "start_time_us": fw["start_us"], "end_time_us": fw["end_us"],
            "duration_us": fw["duration_us"], "pid": fw["pid"], "framework_metric": fw["name"],
            "step": fw["step"].fillna(-1), "worker_id": fw["worker_id"].fillna(-1),
            "num_workers": fw["num_workers"].fillna(-1), "pin_memory": pin, "process": fw["phase"],
            "node_id": fw["process"]}).reset_index(drop=True)


def _with_times(frame: pd.DataFrame, start="start_us", end="end_us") -> pd.DataFrame:
    frame = frame.copy()
    frame.insert(0, "start_time", _human(frame[start]))
    frame.insert(1, "end_time", _human(frame[end]))
    return frame


class PT_dataloader_analysis:  # noqa: N801 (the reference's name)
    """The reference's DataLoader analysis. Each method prints a short summary and returns a frame."""

    def __init__(self, pandas_frame: PandasFrame, outlier_factor: float = dataloader.DEFAULT_OUTLIER_FACTOR):
        self.pd_data_frame = pandas_frame
        self.outlier_factor = outlier_factor
        self.result = dataloader.analyze(pandas_frame.trial.framework, outlier_factor)
        self.window_system_metrics = pd.DataFrame()
        self.window_framework_metrics = pd.DataFrame()

    def analyze_dataloaderIter_initialization(self) -> pd.DataFrame:  # noqa: N802
        init = self.result.initialization
        if init.count == 0:
            print("Trace events corresponding to DataLoaderIter initialization are not present")
            return pd.DataFrame(columns=["start_time", "end_time"] + dataloader.INIT_OUTLIER_COLUMNS)
        for row in init.iterators.itertuples(index=False):
            print(f"{row.type} is configured with pin_memory = {row.pin_memory} and number of workers "
                  f"= {row.num_workers}; initialized {row.count} times, median duration "
                  f"{row.median_us:.0f} us, maximum {row.max_us:.0f} us")
        return self._report_outliers(init.outliers, "iterator initialization")

    def analyze_dataloaderWorkers(self) -> pd.DataFrame:  # noqa: N802
        return self._report_durations(self.result.workers, "DataLoaderWorker processes",
                                      "workers spun off", "worker processes", "worker processes",
                                      dataloader.WORKER_OUTLIER_COLUMNS)

    def analyze_dataloader_getnext(self) -> pd.DataFrame:
        return self._report_durations(self.result.getnext, "DataLoaderIter::GetNext calls",
                                      "GetNext calls made", "GetNext calls", "GetNext durations",
                                      dataloader.GETNEXT_OUTLIER_COLUMNS)

    def _report_durations(self, stats, events: str, counted: str, what: str, outliers_of: str,
                          columns: list[str]) -> pd.DataFrame:
        """The reference's summary of one kind of event with a duration, and its outliers."""
        if stats.count == 0:
            print(f"Trace events corresponding to {events} are not present")
            return pd.DataFrame(columns=["start_time", "end_time"] + columns)
        print(f"Total number of {counted} during the training {stats.count}")
        print(f"Median duration {stats.median_us:.0f} us and maximum duration {stats.max_us:.0f} us "
              f"for {what}")
        return self._report_outliers(stats.outliers, outliers_of)

    def analyze_batchtime(self, start_timestamp=None, end_timestamp=None, select_events=(".*",),
                          select_dimensions=(".*",)) -> pd.DataFrame:
        """Batch-time outliers; with a window, also the metrics inside it (printed, and kept in
        `window_system_metrics` / `window_framework_metrics`)."""
        batch = self.result.batchtime
        if batch.count == 0:
            print("Trace events corresponding to DataLoaderIter::GetNext calls are not present")
            outliers = pd.DataFrame(columns=["previous_batch_start", "start_time", "BatchTime_in_seconds"])
        else:
            print(f"Median time spent on each batch of data = {batch.median_s:.6f} seconds")
            found = batch.outliers
            outliers = pd.DataFrame({
                "previous_batch_start": _human(found["start_us"]), "start_time": _human(found["end_us"]),
                "BatchTime_in_seconds": found["batch_time_s"], "worker_id": found["worker_id"],
                "start_us": found["start_us"], "end_us": found["end_us"], "pid": found["pid"],
                "node": found["node"]})
            if len(outliers):
                print(f"{len(outliers)} batch(es) took more than {self.outlier_factor:g} x the median")
            else:
                print("No outliers found in time taken to process the databatches.")
        if start_timestamp is not None or end_timestamp is not None:
            win = self._window(start_timestamp, end_timestamp, select_events, select_dimensions)
            self.window_system_metrics, self.window_framework_metrics = win.system, win.framework
            print(f"In the window: {len(win.system)} system metric samples, "
                  f"{len(win.framework)} framework events")
        return outliers

    def plot_the_window(self, start_timestamp, end_timestamp, select_events=(".*",),
                        select_dimensions=(".*",)):
        """A plotly figure of the system metrics and the DataLoader events in the window."""
        from ..web.figures import window_figure

        return window_figure(self._window(start_timestamp, end_timestamp, select_events, select_dimensions))

    def _window(self, start, end, select_events, select_dimensions) -> dataloader.Window:
        trial = self.pd_data_frame.trial
        return dataloader.window(trial.framework, trial.system, to_epoch_us(start), to_epoch_us(end),
                                 select_events, select_dimensions)

    def _report_outliers(self, found: pd.DataFrame, what: str) -> pd.DataFrame:
        if len(found):
            print(f"{len(found)} outlier(s) in {what} (duration > {self.outlier_factor:g} x median)")
        else:
            print(f"No outliers found in {what}.")
        return _with_times(found).reset_index(drop=True)
