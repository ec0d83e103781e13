"""Drives the Dash app over HTTP as the browser's renderer does, without a browser.

One `DashSession` is one page load: it reads the page's config (the signed `end_id` every
callback request echoes), learns the callbacks from `/_dash-dependencies` and posts to
`/_dash-update-component` the bodies the renderer posts. Background callbacks follow the
renderer's protocol: the first request starts the job and returns signed `cacheKey`/`job`
handles; the client then polls with them (inputs nulled) until a response comes.

    page = DashSession("http://127.0.0.1:8050").open()
    load = page.find("trial-store.data")
    result = page.call_background(load, {"load-request.data": {"path": "/data/trial"}},
                                  ["load-request.data"])
    result.values["trial-store.data"]["key"]

Used by the server tests and by bench/load_test.py. Loopback only, by its callers' choice.
"""
from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from typing import Any, Callable

import requests

CONFIG = re.compile(r'<script id="_dash-config" type="application/json">(.*?)</script>', re.S)
UPDATE = "_dash-update-component"

# (kind, seconds, HTTP status or None when no response came) for every request made.
OnRequest = Callable[[str, float, "int | None"], None]


def split_output(output: str) -> list[tuple[str, str]]:
    """A callback's output string ('..a.b...c.d..' or 'a.b') as [(id, property)]; the
    '@hash' that allow_duplicate adds to a property is cut, as the renderer does."""
    parts = output[2:-2].split("...") if output.startswith("..") and output.endswith("..") else [output]
    pairs = []
    for part in parts:
        component, _, prop = part.rpartition(".")
        pairs.append((component, prop.split("@")[0]))
    return pairs


@dataclass
class Callback:
    output: str  # as the server keys it
    outputs: list[tuple[str, str]]
    inputs: list[tuple[str, str]]
    state: list[tuple[str, str]]
    background: dict | None
    clientside: bool

    @classmethod
    def from_dependency(cls, dep: dict) -> "Callback":
        return cls(dep["output"], split_output(dep["output"]),
                   [(i["id"], i["property"]) for i in dep["inputs"]],
                   [(s["id"], s["property"]) for s in dep.get("state", [])],
                   dep.get("background"), bool(dep.get("clientside_function")))

    def body(self, values: dict[str, Any], triggered: list[str]) -> dict:
        """The renderer's request body; `values` by 'id.prop' (missing ones are null). A
        wildcard (pattern-matching) dependency, whose id is a JSON object, gets the list of the
        components it matches: `values` gives it as [{"id": {...}, "property": p, "value": v}],
        none ([]) when not given."""
        def one(component, prop):
            if component.startswith("{"):
                return values.get(f"{component}.{prop}", [])
            return {"id": component, "property": prop, "value": values.get(f"{component}.{prop}")}

        def fill(pairs):
            return [one(c, p) for c, p in pairs]

        outputs = [{"id": c, "property": p} for c, p in self.outputs]
        return {"output": self.output, "outputs": outputs if self.multi else outputs[0],  # as the renderer
                "inputs": fill(self.inputs), "changedPropIds": list(triggered), "state": fill(self.state)}

    @property
    def multi(self) -> bool:
        return self.output.startswith("..")


@dataclass
class Result:
    status: int
    values: dict  # 'id.prop' -> value, for the outputs the server updated ({} for a 204)
    text: str  # the raw body (of the last poll, for a background callback)


class CallbackFailed(AssertionError):
    """A callback request answered with a status other than 200/204, or not JSON."""

    def __init__(self, message: str, status: int | None = None, text: str = ""):
        super().__init__(message)
        self.status, self.text = status, text


def flatten(response: dict) -> dict:
    """{'id': {'prop': v}} (Dash's `response`) as {'id.prop': v}."""
    return {f"{component}.{prop}": value for component, props in (response or {}).items()
            for prop, value in props.items()}


def text_of(component) -> str:
    """The text of a Dash component tree as the server sent it (JSON), for assertions."""
    if component is None:
        return ""
    if isinstance(component, (str, int, float)):
        return str(component)
    if isinstance(component, list):
        return " ".join(text_of(c) for c in component)
    if isinstance(component, dict):
        return text_of(component.get("props", {}).get("children"))
    return ""


class DashSession:
    """One page load of the app at `base_url`, driven over HTTP."""

    def __init__(self, base_url: str, *, timeout: float = 30.0, on_request: OnRequest | None = None,
                 http: requests.Session | None = None):
        self.base_url = base_url.rstrip("/") + "/"
        self.timeout = timeout
        self.on_request = on_request
        self.http = http or requests.Session()
        self.end_id: str | None = None
        self.callbacks: list[Callback] = []

    def open(self, callbacks: list[Callback] | None = None) -> "DashSession":
        """GET the page (for this page load's end_id) and, unless given, the callbacks."""
        page = self._timed("page", lambda: self.http.get(self.base_url, timeout=self.timeout))
        if page.status_code != 200:
            raise CallbackFailed(f"GET / answered {page.status_code}", page.status_code, page.text[:2000])
        found = CONFIG.search(page.text)
        if not found:
            raise CallbackFailed("the page has no _dash-config", page.status_code, page.text[:2000])
        self.end_id = json.loads(found.group(1)).get("end_id")
        if callbacks is None:
            deps = self._timed("dependencies",
                               lambda: self.http.get(self.base_url + "_dash-dependencies", timeout=self.timeout))
            callbacks = [Callback.from_dependency(d) for d in deps.json()]
        self.callbacks = callbacks
        return self

    def find(self, output: str) -> Callback:
        """The server-side callback that has `output` ('id.prop') among its outputs."""
        pair = tuple(output.rsplit(".", 1))
        found = [cb for cb in self.callbacks if pair in cb.outputs and not cb.clientside]
        if len(found) != 1:
            raise LookupError(f"{len(found)} server callbacks output {output}")
        return found[0]

    # --- requests ------------------------------------------------------------------------

    def _timed(self, kind: str, send: Callable[[], requests.Response]) -> requests.Response:
        started = time.perf_counter()
        try:
            response = send()
        except requests.RequestException:
            if self.on_request:
                self.on_request(kind, time.perf_counter() - started, None)
            raise
        if self.on_request:
            self.on_request(kind, time.perf_counter() - started, response.status_code)
        return response

    def post(self, body, params: dict | None = None, kind: str = "raw") -> requests.Response:
        """One POST of a JSON body to /_dash-update-component (with this page's endId). No
        status check: for tests of what the server answers."""
        query = {"endId": self.end_id} if self.end_id else {}
        query.update(params or {})
        return self._timed(kind, lambda: self.http.post(self.base_url + UPDATE, params=query, json=body,
                                                        timeout=self.timeout))

    @staticmethod
    def _result(response: requests.Response) -> Result:
        if response.status_code == 204:  # PreventUpdate: nothing changes
            return Result(204, {}, response.text)
        if response.status_code != 200:
            raise CallbackFailed(f"callback answered {response.status_code}: {response.text[:300]!r}",
                                 response.status_code, response.text)
        try:
            data = response.json()
        except ValueError:
            raise CallbackFailed("callback answered non-JSON", 200, response.text) from None
        return Result(200, data, response.text)

    def call(self, callback: Callback, values: dict[str, Any], triggered: list[str],
             kind: str = "callback") -> Result:
        """A plain callback: its outputs by 'id.prop'."""
        result = self._result(self.post(callback.body(values, triggered), kind=kind))
        if result.status == 200:
            result.values = flatten(result.values.get("response"))
        return result

    def call_background(self, callback: Callback, values: dict[str, Any], triggered: list[str], *,
                        poll_s: float | None = None, timeout_s: float = 60.0, kind: str = "background",
                        on_progress: Callable[[dict], None] | None = None) -> Result:
        """A background callback: start the job, then poll it as the renderer does (every
        `interval` ms of the callback unless `poll_s`) until its response. `on_progress` gets
        each poll's progress outputs ({'id.prop': value}); a failure raises CallbackFailed."""
        body = callback.body(values, triggered)
        started = self._result(self.post(body, kind=f"{kind}_start"))
        if started.status == 204:
            return started
        handles = started.values
        if "response" in handles:  # answered at once (a cached result)
            return Result(200, flatten(handles["response"]), started.text)
        if "cacheKey" not in handles or "job" not in handles:
            raise CallbackFailed(f"background start gave no job handles: {started.text[:300]!r}", 200,
                                 started.text)
        if poll_s is None:
            poll_s = (callback.background or {}).get("interval", 500) / 1000
        polled = callback.body({}, triggered)  # the renderer nulls inputs and state when polling
        params = {"cacheKey": handles["cacheKey"], "job": handles["job"]}
        deadline = time.monotonic() + timeout_s
        while True:
            if time.monotonic() > deadline:
                raise CallbackFailed(f"background callback gave no response within {timeout_s} s")
            time.sleep(poll_s)
            result = self._result(self.post(polled, params=params, kind=f"{kind}_poll"))
            if result.status == 204:
                return result
            if on_progress and result.values.get("progress"):
                on_progress(dict(result.values["progress"]))
            if "response" in result.values:
                return Result(200, flatten(result.values["response"]), result.text)
