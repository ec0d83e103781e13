"""The reference's API names, as an old notebook calls them."""
from __future__ import annotations

import statistics

import pytest

from dashboard import PT_dataloader_analysis, PandasFrame
from dashboard.synthetic import write_trial


@pytest.fixture(scope="module")
def notebook(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("nb"))
    synthetic = write_trial(folder, slow_batches={(2, 5): 80_000}, gpus=1)
    return synthetic, PandasFrame(folder)


def test_pandas_frame_columns(notebook):
    synthetic, pf = notebook
    system = pf.get_all_system_metrics()
    assert list(system.columns) == ["timestamp", "timestamp_us", "value", "system_metric", "dimension",
                                    "nodeID", "type"]
    assert len(system) == synthetic.system_samples
    fw = pf.get_all_framework_metrics()
    assert {"start_time", "end_time", "start_time_us", "end_time_us", "framework_metric", "step", "process",
            "nodeID", "pid"} <= set(fw.columns)
    dl = pf.get_all_dataloader_metrics(selected_framework_metrics=[".*DataLoaderIter::GetNext"])
    assert list(dl.columns) == ["start_time", "end_time", "start_time_us", "end_time_us", "duration_us", "pid",
                                "framework_metric", "step", "worker_id", "num_workers", "pin_memory",
                                "process", "node_id"]
    assert len(dl) == len(synthetic.of_kind("getnext"))
    assert len(pf.get_all_dataloader_metrics(["DataLoaderWorker"])) == len(synthetic.of_kind("worker"))


def test_five_methods(notebook, capsys):
    synthetic, pf = notebook
    analysis = PT_dataloader_analysis(pf)
    init = analysis.analyze_dataloaderIter_initialization()
    out = capsys.readouterr().out
    assert "_MultiProcessingDataLoaderIter" in out and "_SingleProcessDataLoaderIter" in out
    assert "initialized 3 times" in out
    assert len(init) == len([e for e in synthetic.of_kind("init")
                             if e.duration_us > 2 * statistics.median(x.duration_us for x in synthetic.of_kind("init"))])
    analysis.analyze_dataloaderWorkers()
    assert f"training {len(synthetic.of_kind('worker'))}" in capsys.readouterr().out
    getnext = analysis.analyze_dataloader_getnext()
    out = capsys.readouterr().out
    assert f"training {len(synthetic.of_kind('getnext'))}" in out
    assert f"{len(getnext)} outlier(s) in GetNext durations" in out  # the reference's words
    assert getnext["duration_us"].iloc[0] == 80_000 and "start_time" in getnext
    slow = next(e for e in synthetic.of_kind("getnext") if e.duration_us == 80_000)
    batches = analysis.analyze_batchtime(slow.start_us - 50_000, slow.end_us + 50_000,
                                         select_events=["GetNext"], select_dimensions=["CPU"])
    assert "BatchTime_in_seconds" in batches and len(batches) >= 1
    assert slow.start_us in set(analysis.window_framework_metrics["start_us"])
    fig = analysis.plot_the_window(slow.start_us - 50_000, slow.end_us + 50_000)
    getnext = [t for t in fig.data if t.name == "DataLoaderIter"]
    assert getnext and any("80 ms" in str(h) for h in getnext[0].hovertext)
    lo, hi = fig.layout.xaxis.range  # epoch milliseconds
    assert lo <= (slow.start_us - 50_000) / 1e3 + 1 and hi >= (slow.end_us + 50_000) / 1e3 - 1
    # a window wide enough for system samples draws them too, with the events
    wide = analysis.plot_the_window(slow.start_us - 2_000_000, slow.end_us + 2_000_000,
                                    select_dimensions=["CPUUtilization", "GPU"])
    names = {t.name for t in wide.data}
    assert {"cpu0", "cpu1", "DataLoaderIter"} <= names and "MemoryUsedPercent" not in names
