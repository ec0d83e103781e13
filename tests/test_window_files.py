"""A window of a trial over the server's event budget is read from the files it reaches
(dashboard/trial/window_files.py): the payload a drag draws is the one the whole trial gives."""
from __future__ import annotations

import dataclasses
import os
import shutil

import pandas as pd
import pytest
from plotly.io.json import to_json_plotly

from dashboard.analysis import dataloader
from dashboard.synthetic import write_job, write_trial
from dashboard.trial import window_files
from dashboard.web import callbacks, views
from dashboard.web.cache import TrialCache
from tests.conftest import ROOT

SAMPLE = os.path.join(ROOT, "examples", "sample-trial", "trial")


def _write(kind: str, folder: str) -> str:
    if kind == "sample":
        shutil.copytree(SAMPLE, folder)
    elif kind == "hosts":  # the reference's writers: 2 hosts, a file every 2 s
        write_trial(folder, hosts=2, epochs=3, train_batches=400, val_batches=20, num_workers=2, rotate_s=2,
                    slow_batches={(1, 7): 90_000}, seed=4)
    else:  # 8 ranks on 2 hosts, with a slow one
        write_job(folder, hosts=2, ranks_per_host=4, steps=300, slow_rank=5, rotate_s=1, seed=2)
    return folder


@pytest.fixture(scope="module", params=["sample", "hosts", "job"])
def loaded(request, tmp_path_factory):
    folder = _write(request.param, str(tmp_path_factory.mktemp("trial") / "trial"))
    cache = TrialCache(str(tmp_path_factory.mktemp("cache")))
    key, trial, _ = cache.load(folder, roots=[folder])
    listing = cache.listing(folder, roots=[folder])[2]
    return folder, cache, key, trial, window_files.trial_files(trial, listing)


def _windows(trial, files):
    """The whole job, its first tenth, a middle second, a window across two files' boundary, a
    few batches, and one before the job."""
    start, end = trial.start_us, trial.end_us
    boundary = int(sorted(files.last_us)[len(files.last_us) // 2])
    getnexts = trial.framework[trial.framework["kind"] == "getnext"]
    some = getnexts.iloc[len(getnexts) // 3: len(getnexts) // 3 + 5]
    middle = (start + end) // 2
    return [(start, end), (start, start + (end - start) // 10), (middle, middle + 1_000_000),
            (boundary - 300_000, boundary + 300_000), (int(some["start_us"].min()), int(some["end_us"].max())),
            (start - 10_000_000, start - 5_000_000)]


def _identities(framework) -> dict:
    def value(number):
        return None if pd.isna(number) else int(number)

    firsts = framework.drop_duplicates("process")
    return {row.process: (value(row.rank), value(row.local_rank)) for row in firsts.itertuples()}


def test_the_files_a_window_reaches_give_the_whole_trials_payload(loaded):
    folder, cache, key, trial, files = loaded
    assert len(files.files) > 2  # (several files: a window can leave some out)
    narrower = 0
    for node in [None, *trial.nodes, trial.processes[-1].id]:
        view = views.trial_view(trial, node, key=key)
        base = views.window_base(view)
        for lo, hi in _windows(trial, files):
            pad = base.sample_gap_us
            part = window_files.read_window(files, lo - pad, hi + pad, roots=[folder], file_cache=cache.files)
            narrower += 0 < len(part.report.read_paths) < len(files.files)
            # The window's frames are the whole trial's, rows, values and types (categories in order).
            mine = window_files.window_part(files, part, node)
            for windowed, whole in zip(
                    (dataloader.window(mine.framework, mine.system, lo - pad, hi + pad).framework,
                     dataloader.window(mine.framework, mine.system, lo - pad, hi + pad).system),
                    (dataloader.window(view.trial.framework, view.trial.system, lo - pad, hi + pad).framework,
                     dataloader.window(view.trial.framework, view.trial.system, lo - pad, hi + pad).system)):
                pd.testing.assert_frame_equal(windowed, whole)
            # Each process keeps the whole trial's rank and local rank (the collector writes them on
            # the iterators' creation only, which a window may not reach).
            assert _identities(part.framework).items() <= _identities(trial.framework).items()
            for events, loader in ((".*", None), ("GetNext", view.assessment.budget and views.budget_rows(view)[-1]["key"])):
                whole = views.window_payload(view, lo, hi, events, ".*", loader=loader)
                windowed = views.window_payload_of(base, mine, lambda row: views.loader_batches_of(view, row),
                                                   lo, hi, events, ".*", loader)
                assert to_json_plotly(windowed) == to_json_plotly(whole), (node, lo, hi, events)
    assert narrower >= 3  # the narrow windows read only some of the files


def test_a_window_is_read_from_the_parsed_columns(loaded, tmp_path):
    """The files' parses are in the cache: a window reads them, not the files (here deleted)."""
    folder, cache, key, trial, files = loaded
    copy = str(tmp_path / "trial")
    shutil.copytree(folder, copy)
    load = TrialCache(cache.directory)
    copied_key, copied, _ = load.load(copy, roots=[copy])
    copied_files = window_files.trial_files(copied, load.listing(copy, roots=[copy])[2])
    for info in copied_files.files:
        os.remove(os.path.join(copy, info.key))
    lo, hi = copied.start_us, copied.end_us
    part = window_files.read_window(copied_files, lo, hi, roots=[copy], file_cache=load.files)
    assert len(part.framework) == len(copied.framework) and len(part.system) == len(copied.system)
    assert part.report.files_read == len(copied_files.files) and not part.report.files_skipped


def test_a_drag_of_a_trial_over_the_event_budget_reads_only_the_files_of_its_window(loaded, monkeypatch):
    """The server's path: the load keeps the trial's files, the page's first window (drawn from the
    whole trial) its window base and loader batches; another server process then draws a drag
    without reading the trial back, the same payload, and refuses a window over the budget."""
    folder, cache, key, trial, files = loaded
    middle = (trial.start_us + trial.end_us) // 2
    lo, hi = middle - 100_000, middle + 100_000
    # A budget this window fits in and the trial does not (the window is drawn padded by a system
    # sample's interval on each side: the budget here takes two, to be clear of it).
    pad = 2 * views.trial_view(trial).sample_gap_us
    budget = int(files.window_nbytes(lo - pad, hi + pad) * callbacks.WINDOW_READ_PER_EVENT_BYTE)
    assert budget < files.nbytes * callbacks.WHOLE_VIEW_PER_EVENT_BYTE
    context = callbacks.Context(cache=cache, default_trial=folder, roots=[folder], event_budget=budget)
    callbacks.keep_trial_files(context, key, trial, cache.listing(folder, roots=[folder])[2])
    callbacks.draw_window(context, key, None, trial.start_us, trial.end_us, ".*", ".*", None, None)
    expected = to_json_plotly(views.window_payload(callbacks.get_view(context, key, None), lo, hi))

    other = dataclasses.replace(context, cache=TrialCache(cache.directory))  # a new server process
    monkeypatch.setattr(TrialCache, "trial", lambda self, key: pytest.fail("the whole trial was read back"))
    assert to_json_plotly(callbacks.draw_window(other, key, None, lo, hi, ".*", ".*", None, None)) == expected
    assert not other.cache.memoized(f"view:{key}:")
    with pytest.raises(callbacks.WindowNotDrawn, match="event budget"):
        callbacks.draw_window(other, key, None, trial.start_us, trial.end_us, ".*", ".*", None, None)


def test_a_trial_whose_view_fits_the_budget_is_drawn_whole(loaded):
    """Within the budget the drag takes the whole trial's view (held once, no file read again);
    without a budget too."""
    folder, cache, key, trial, files = loaded
    for budget in (files.nbytes * 2, None):
        fresh = TrialCache(cache.directory)  # (a process that holds no view of it)
        context = callbacks.Context(cache=fresh, default_trial=folder, roots=[folder], event_budget=budget)
        callbacks.keep_trial_files(context, key, trial, cache.listing(folder, roots=[folder])[2])
        assert not fresh.memoized(f"view:{key}:")
        assert callbacks._draw_window_from_files(context, key, None, trial.start_us, trial.end_us, ".*", ".*",
                                                 None, None) is None
    # (And over it, the same call draws from the files: what the two cases above are told apart from.)
    fresh = TrialCache(cache.directory)
    over = int(files.nbytes * callbacks.WHOLE_VIEW_PER_EVENT_BYTE) - 1  # (the view, a byte over)
    context = callbacks.Context(cache=fresh, default_trial=folder, roots=[folder], event_budget=over)
    callbacks.draw_window(dataclasses.replace(context, cache=cache), key, None, trial.start_us, trial.end_us,
                          ".*", ".*", None, None)  # (keeps the window base, as the first page does)
    middle = (trial.start_us + trial.end_us) // 2
    assert callbacks._draw_window_from_files(context, key, None, middle, middle + 1_000, ".*", ".*",
                                             None, None) is not None


def test_a_process_scope_keeps_its_hosts_metrics_in_a_window_without_its_events(loaded):
    folder, cache, key, trial, files = loaded
    process = trial.processes[-1]
    part = window_files.read_window(files, trial.start_us, trial.end_us, roots=[folder], file_cache=cache.files)
    others = part.framework[(part.framework["process"] != process.id).to_numpy()].reset_index(drop=True)
    without = window_files.window_part(files, dataclasses.replace(part, framework=others), process.id)
    assert without.framework.empty
    pd.testing.assert_frame_equal(without.system, trial.for_node(process.id).system)


def test_a_new_server_process_draws_a_drag_of_a_trial_over_its_event_budget_from_the_files(tmp_path):
    """Over HTTP, as the browser drives it: a server with a 1 MB event budget loads a trial of
    about 4 MB of events and draws its first page; the trial's own cache entry is then made
    unreadable (test_server_hardening's proof that nothing reads it). A new server process shows
    the first page, draws a drag of a tenth of a second from the files it reaches, and refuses the
    whole job with another events filter, saying why."""
    import diskcache

    from tests.test_server_hardening import Unreadable, first_page, load, loaded_store, start_servers

    data = tmp_path / "data"
    trial = str(data / "trial")
    write_trial(trial, hosts=2, epochs=2, train_batches=4000, val_batches=0, num_workers=2, rotate_s=2, seed=5)
    cache = tmp_path / "cache"
    args = ("serve", "--cache-dir", str(cache), "--data-root", str(data), "--event-budget-mb", "1")
    (first,) = start_servers(tmp_path, 1, *args)
    try:
        page = first.page()
        store = loaded_store(load(page, trial))
        drawn = first_page(page, store)
    finally:
        first.stop()
    with diskcache.Cache(os.path.join(str(cache), "trials")) as disk:
        disk[f"trial:{store['key']}"] = Unreadable()
    (second,) = start_servers(tmp_path, 1, *args)
    try:
        page = second.page()
        again = loaded_store(load(page, trial))
        assert first_page(page, again) == drawn

        def drag(start_us: int, end_us: int, events: str):
            window = {**drawn["window"], "start_us": start_us, "end_us": end_us}
            result = page.call(page.find("window-graph.figure"),
                               {"window-store.data": window, "select-events.value": events,
                                "select-dimensions.value": ".*", "node-select.value": "",
                                "what-if-loader.value": "", "trial-store.data": again}, ["window-store.data"])
            assert result.status == 200, result.text[:300]
            return result.values

        middle = (store["start_us"] + store["end_us"]) // 2
        narrow = drag(middle - 50_000, middle + 50_000, ".*")
        assert not narrow.get("window-error.children"), narrow
        figure = narrow["window-graph.figure"]
        names = {trace.get("name") for trace in figure["data"]}
        assert {"DataLoaderIter", "Step:ModeKeys.TRAIN"} <= names  # the GetNexts and steps of that window
        assert figure["layout"]["xaxis"]["range"] == [(middle - 50_000) / 1000, (middle + 50_000) / 1000]
        whole = drag(store["start_us"], store["end_us"], "GetNext")
        assert "event budget" in whole["window-error.children"] and "window-graph.figure" not in whole
        assert second.alive()
    finally:
        second.stop()


def test_a_window_whose_files_are_gone_says_so_instead_of_drawing_part_of_it(loaded, tmp_path):
    """A file the load read, no longer in the columnar cache and gone from the trial: the window
    is not drawn from the files that are left."""
    from dashboard.trial.errors import TrialError

    folder, cache, key, trial, files = loaded
    copy = str(tmp_path / "trial")
    shutil.copytree(folder, copy)
    copied, listing = dashboard_load(copy)
    copied_files = window_files.trial_files(copied, listing)
    gone = copied_files.files[0]
    os.remove(os.path.join(copy, gone.key))
    with pytest.raises(TrialError, match="could not be read again"):
        window_files.read_window(copied_files, int(copied_files.first_us[0]), int(copied_files.last_us[0]),
                                 roots=[copy])
    # The files that are left still draw the windows that do not reach the gone one.
    elsewhere = [int(t) for t in copied_files.last_us if not copied_files.reaching(int(t), int(t))[0]]
    for moment in elsewhere[:3]:
        part = window_files.read_window(copied_files, moment, moment, roots=[copy])
        assert part.report.files_read and gone.key not in part.report.read_paths


def dashboard_load(folder: str):
    """A trial loaded whole, without a file cache, and the listing it was loaded from."""
    from dashboard.trial.load import load_trial
    from dashboard.trial.store import open_store

    listing = open_store(folder, roots=[folder]).list()
    return load_trial(folder, roots=[folder], files=listing), listing
