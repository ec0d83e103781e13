"""A client's input that cost the server its time, its answers or its secrets, driven over HTTP
against the app in a process of its own (`python app.py serve`), with the pure functions behind
them checked directly:

- an events filter that makes a backtracking regex engine run for ages (ReDoS) is refused with a
  clear message, and ordinary filters match as Python's `re.search` does;
- a time text of megabytes in a drag is answered at once, not parsed;
- a URL's start/end that are no epoch-microsecond moment ("²", 26 or 5,000 digits) leave the
  window unset and the trial loads;
- an S3 endpoint's credentials (AWS_ENDPOINT_URL=http://user:secret@host) and a typed path's
  userinfo (its secret with "/" too) never reach the page, the log or a command's error line;
- a malformed callback payload logs one line, not a traceback.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from urllib.parse import urlencode

import numpy as np
import pandas as pd
import pytest
import requests

from dashboard.analysis import dataloader
from dashboard.synthetic import write_trial
from dashboard.web import views
from tests.conftest import ROOT, free_port
from tests.dash_http import DashSession
from tests.test_server_hardening import POLL_S, TRACEBACK, load, loaded_store, running, server_env

# Lookahead in front of nested quantifiers: Python's `re` backtracks 2**26 ways at each of the last
# 26 places of a text without "#" (minutes of one thread, holding the GIL: the server stalled).
REDOS = r"(?=.{0,26}$)(.+)+#"
ENDPOINT_USER, ENDPOINT_SECRET = "minio-user", "minio-secret-pw-3141"
TYPED_SECRET = "wJalrTypedSecretKey27"
# An AWS secret key is base64: it may hold "/", which ended the userinfo a redaction looked for
# (the path then names the bucket "AKIATYPEDKEY:wJalr", the rest of the secret in its key).
SLASHED_SECRET = "wJalr/K7MDENG/bPxRfiCYEXAMPLEKEY"
ANSWER_S = 30  # far above what each request below takes once fixed; far below what it took before


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The server with an S3 endpoint in its environment that names credentials, and nothing
    listening at it; one small local trial under its data root."""
    tmp = tmp_path_factory.mktemp("input-hardening")
    data = tmp / "data"
    trial = str(data / "trial")
    written = write_trial(trial, epochs=1)
    endpoint = f"http://{ENDPOINT_USER}:{ENDPOINT_SECRET}@127.0.0.1:{free_port()}"
    env = server_env(tmp, AWS_ENDPOINT_URL=endpoint, AWS_ACCESS_KEY_ID="AKIAFAKEFORTESTS",
                     AWS_SECRET_ACCESS_KEY="fake-secret-for-tests", AWS_DEFAULT_REGION="us-east-1")
    with running(str(tmp / "server.log"), "serve", "--cache-dir", str(tmp / "cache"), "--data-root", str(data),
                 env=env) as server:
        server.trial, server.written = trial, written
        yield server


@pytest.fixture(scope="module")
def loaded(served):
    page = DashSession(served.url, timeout=ANSWER_S).open()
    store = loaded_store(load(page, served.trial))
    window = {"key": store["key"], "path": store["path"], "start_us": store["start_us"], "end_us": store["end_us"],
              "selected": None}
    return page, store, window


def unchanged(response: requests.Response) -> bool:
    """Whether a callback answered "no change" (Dash: a 204, or a 200 without outputs)."""
    assert response.status_code in (200, 204), response.text[:300]
    return response.status_code == 204 or response.json().get("response") == {}


# --- 1. the events filter runs in linear time -----------------------------------------------------

def test_filter_refuses_what_a_linear_engine_cannot_run_and_says_why():
    for pattern in (REDOS, r"(a)\1", r"(?<!a)b", r"(?>a+)b", "a++b"):
        with pytest.raises(ValueError, match="lookaround, backreferences .* not supported") as raised:
            dataloader.validate_patterns([pattern])
        assert repr(pattern) in str(raised.value)
    with pytest.raises(ValueError, match="invalid regular expression '\\(': missing \\)"):
        dataloader.validate_patterns(["("])
    # What the page's filter is for: names, alternatives, classes, anchors, case.
    assert dataloader.validate_patterns(["GetNext|Step", "", r"^\w+\.__next__$", "(?i)cpu"]) == [
        "GetNext|Step", r"^\w+\.__next__$", "(?i)cpu"]


def test_filter_matches_ordinary_patterns_as_python_re_search():
    names = ["DataLoaderIter.GetNext", "Step:train", "cpu0", "CPUUtilization", "gpu_1", "", "a#b", "x.__next__"]
    patterns = [["GetNext"], ["^Step"], ["cpu\\d$"], ["(?i)cpu"], ["GetNext", "gpu_[0-9]"], [".*"], ["#"],
                [r"\.__next__$"], ["^$"], ["utili[sz]ation"]]
    for column in (pd.Series(names, dtype="category"), pd.Series(names + [None], dtype=object)):
        for chosen in patterns:
            expected = [value is not None and any(re.search(p, value) for p in chosen) for value in column]
            got = dataloader._matches_any(column, chosen)
            assert got.tolist() == expected, chosen
            assert got.index.equals(column.index)
    # A missing category (code -1) matches nothing, not even ".*".
    codes = pd.Series(pd.Categorical.from_codes(np.array([0, -1]), categories=["a"]))
    assert dataloader._matches_any(codes, [".*"]).tolist() == [True, False]


def test_a_redos_filter_gets_the_message_at_once_and_an_ordinary_one_still_draws(served, loaded):
    page, store, window = loaded
    draw = page.find("window-error.children")
    answer = page.call(draw, {"window-store.data": window, "trial-store.data": store, "select-events.value": REDOS,
                              "select-dimensions.value": ".*"}, ["select-events.value"])
    message = answer.values["window-error.children"]
    assert "invalid regular expression" in message and "lookaround" in message, message
    assert requests.get(served.url + "healthz", timeout=5).status_code == 200
    drawn = page.call(draw, {"window-store.data": window, "trial-store.data": store, "select-events.value": "GetNext",
                             "select-dimensions.value": ".*"}, ["select-events.value"])
    assert drawn.values["window-error.children"] == ""
    assert drawn.values["window-graph.figure"]["data"]


# --- 2. and 3. time texts ---------------------------------------------------------------------------

def test_parse_time_us_refuses_long_texts_and_moments_outside_int64_microseconds():
    moment = "2026-11-29T21:10:08.123456Z"
    assert views.parse_time_us(moment) == 1795986608123456
    assert views.parse_time_us(" " * 64 + moment) is None  # parsed before, whatever its length
    assert views.parse_time_us("1" + "0" * 15) == 10**15
    assert views.parse_time_us("-86400000000") == -86400000000
    for no_moment in ("²", "1²", "٣", "--5", "9" * 26, "9" * 5000, "10000-01-01", 1e300, -1e20,
                      str(2**63), "x" * 1_000_000):
        assert views.parse_time_us(no_moment) is None, str(no_moment)[:40]
    assert views.range_from_ms(1e300) is None  # a drag's number: milliseconds
    assert views.time_window("1", "2") == [1, 2]
    assert views.time_window("0", "9" * 26) is None and views.time_window("2", "1") is None


def test_a_drag_range_of_megabytes_is_answered_at_once(served, loaded):
    page, store, window = loaded
    relayout = {"xaxis.range[0]": "x" * 3_000_000, "xaxis.range[1]": 1}
    response = page.post(page.find("window-store.data").body(
        {"trial-store.data": store, "overview-graph.relayoutData": relayout, "window-store.data": window},
        ["overview-graph.relayoutData"]))
    assert unchanged(response)  # no range: the window stays
    assert served.alive()


@pytest.mark.parametrize("start,end", [("0", "9" * 26), ("²", "5"), ("1", "9" * 5000), ("-1e400", "1")],
                         ids=["end-over-2**64", "superscript-digit", "5000-digits", "float-text"])
def test_url_times_that_are_no_moment_leave_the_window_unset_and_the_trial_loads(served, loaded, start, end):
    page = loaded[0]
    search = "?" + urlencode({"trial": served.trial, "start": start, "end": end})
    asked = page.call(page.find("load-request.data"), {"url.search": search}, ["url.search"]).values[
        "load-request.data"]
    assert asked["path"] == served.trial and asked["window"] is None
    result = page.call_background(page.find("trial-store.data"), {"load-request.data": asked},
                                  ["load-request.data"], poll_s=POLL_S, timeout_s=ANSWER_S)
    assert loaded_store(result)["window"] is None


def test_a_load_request_with_a_nonce_past_int64_loads_without_it(served, loaded):
    # The nonce is the page's time.time(), carried back so the page knows which load answered; a
    # client's int of 2**64 or more failed the answer with HTTP 500 (orjson cannot write it).
    page = loaded[0]
    result = page.call_background(page.find("trial-store.data"),
                                  {"load-request.data": {"path": served.trial, "nonce": 2**64}},
                                  ["load-request.data"], poll_s=POLL_S, timeout_s=ANSWER_S)
    assert loaded_store(result)["nonce"] is None


def test_a_load_request_with_a_window_past_int64_loads_without_it(served, loaded):
    page = loaded[0]
    result = page.call_background(page.find("trial-store.data"),
                                  {"load-request.data": {"path": served.trial, "window": [0, 10**30]}},
                                  ["load-request.data"], poll_s=POLL_S, timeout_s=ANSWER_S)
    assert loaded_store(result)["window"] is None


# --- 4. credentials in URLs -------------------------------------------------------------------------

def test_endpoint_and_typed_credentials_never_reach_the_page_or_the_log(served, loaded):
    page = loaded[0]
    unreachable = load(page, "s3://some-bucket/trial", timeout_s=ANSWER_S).values["error-message.children"]
    assert "cannot reach S3" in unreachable and "127.0.0.1" in unreachable, unreachable
    typed = load(page, f"s3://AKIATYPEDKEY:{TYPED_SECRET}@some-bucket/trial",
                 timeout_s=ANSWER_S).values["error-message.children"]
    assert typed and "some-bucket" in typed, typed
    slashed = load(page, f"s3://AKIATYPEDKEY:{SLASHED_SECRET}@some-bucket/trial",
                   timeout_s=ANSWER_S).values["error-message.children"]
    assert slashed and "some-bucket" in slashed, slashed
    for secret in (ENDPOINT_SECRET, ENDPOINT_USER, TYPED_SECRET, "AKIATYPEDKEY", *SLASHED_SECRET.split("/")):
        assert secret not in unreachable + typed + slashed, (secret, unreachable, typed, slashed)
        assert secret not in served.log()


def test_the_command_line_error_has_no_credentials(tmp_path):
    # What a command prints lands in CI logs: the typed path's secret and the endpoint's are cut
    # there as on the page (botocore names the bucket it refuses, "AKIATYPEDKEY:wJalr").
    env = server_env(tmp_path, AWS_ENDPOINT_URL=f"http://{ENDPOINT_USER}:{ENDPOINT_SECRET}@127.0.0.1:{free_port()}",
                     AWS_ACCESS_KEY_ID="AKIAFAKEFORTESTS", AWS_SECRET_ACCESS_KEY="fake-secret-for-tests",
                     AWS_DEFAULT_REGION="us-east-1")
    for path in (f"s3://AKIATYPEDKEY:{SLASHED_SECRET}@some-bucket/trial", "s3://some-bucket/trial"):
        done = subprocess.run([sys.executable, os.path.join(ROOT, "app.py"), "analyze", path], env=env, capture_output=True, text=True,
                              timeout=ANSWER_S)
        assert done.returncode == 2 and done.stderr.startswith("error: s3://some-bucket/trial: "), done.stderr
        for secret in (ENDPOINT_SECRET, ENDPOINT_USER, "AKIATYPEDKEY", *SLASHED_SECRET.split("/")):
            assert secret not in done.stdout + done.stderr, (secret, done.stderr)


# --- 5. malformed payloads: one log line each -------------------------------------------------------

def test_a_malformed_payload_logs_one_line_without_its_traceback(served, loaded):
    page, store, window = loaded
    before = len(served.log().splitlines())
    set_window = page.find("window-store.data")
    for _ in range(3):
        response = page.post(set_window.body({"trial-store.data": store, "window-store.data": window,
                                              "overview-graph.relayoutData": {"selections": ["x"]}},
                                             ["overview-graph.relayoutData"]))
        assert unchanged(response)  # the window stays
    failed = page.call_background(page.find("trial-store.data"), {"load-request.data": {"path": 123}},
                                  ["load-request.data"], poll_s=POLL_S, timeout_s=ANSWER_S)
    message = failed.values["error-message.children"]
    assert message == "Loading 123 failed (AttributeError); the details are in the server log.", message
    added = served.log().splitlines()[before:]
    assert not TRACEBACK.search("\n".join(added)), "\n".join(added)[:2000]
    assert len([line for line in added if "Setting the window failed: AttributeError: " in line]) == 3, added
    assert len([line for line in added if "Loading 123 failed: AttributeError: " in line]) == 1, added


@pytest.mark.parametrize("message, kept, secrets", [
    ("load failed: http://user:pw@host/x", "load failed: http://host/x", ["user:pw"]),
    # a URL inside another's path or query (a proxy's, a redirect's)
    ("http://a/b/http://user:pw@c/d refused", "http://a/b/http://c/d refused", ["user:pw"]),
    ("see http://proxy/?u=http://user:pw@inner/x ok", "see http://proxy/ ok", ["user:pw"]),
    # an "@" in the password, a signature in a query, a repeat of the userinfo elsewhere
    ("https://me@corp:p4ss@host/p?X-Amz-Signature=abc1 end", "https://host/p end", ["p4ss", "abc1"]),
    ("s3://AKIAKEY:s3cr3t@bkt/x: NoSuchBucket AKIAKEY:s3cr3t@bkt", "s3://bkt/x: NoSuchBucket bkt",
     ["AKIAKEY", "s3cr3t"]),
    ("no URL here: a@b, http://h/p@q", "no URL here: a@b, http://h/p@q", []),
    # a password that holds "/" (an AWS secret key), and each of its pieces repeated
    (f's3://AKIAKEY:{SLASHED_SECRET}@bkt/x: Invalid bucket name "AKIAKEY:wJalr", key "K7MDENG/bPxRfiCYEXAMPLEKEY@bkt/x"',
     's3://bkt/x: Invalid bucket name "", key "/@bkt/x"', ["AKIAKEY", *SLASHED_SECRET.split("/")]),
    ('connect to "http://minio:ab/cd@host:9000/b?list-type=2"', 'connect to "http://host:9000/b"', ["minio", "ab/cd"]),
    # a port before a path that holds an "@" is no password: the message stays whole
    ("http://minio.local:9000/bucket/user@example.com/trial: the bucket does not exist",
     "http://minio.local:9000/bucket/user@example.com/trial: the bucket does not exist", []),
    # a shorter userinfo that lies inside a longer one's repeat
    ("http://a@h1/ and s3://z:pa@bkt/k; NoSuchBucket z:pa@bkt", "http://h1/ and s3://bkt/k; NoSuchBucket bkt",
     ["z:p", "pa@"]),
])
def test_a_message_loses_the_secrets_of_its_urls(message, kept, secrets):
    from dashboard.trial.store import redact

    assert redact(message) == kept
    for secret in secrets:
        assert secret not in redact(message)
