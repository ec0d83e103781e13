"""`python3 app.py --trial ...`, the README's first command, as a user starts it: a real process."""
from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request

from dashboard.web.server import STARTED
from tests.conftest import ROOT, free_port


def test_start_up_says_one_line_with_the_url_in_our_own_words(tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    out_path, err_path = tmp_path / "stdout", tmp_path / "stderr"
    with open(out_path, "w") as out, open(err_path, "w") as err:
        server = subprocess.Popen([sys.executable, "app.py", "--trial", "examples/sample-trial/trial",
                                   "--port", str(port), "--cache-dir", str(tmp_path / "cache")],
                                  cwd=ROOT, stdout=out, stderr=err, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    try:
        deadline = time.time() + 60
        while url not in out_path.read_text() and time.time() < deadline and server.poll() is None:
            time.sleep(0.1)
        page = urllib.request.urlopen(url, timeout=10)
        assert page.status == 200 and b"DataLoader Profiler" in page.read()
        urllib.request.urlopen(url + "healthz", timeout=10).read()
        time.sleep(0.5)  # a request line, were one logged, would be written by now
    finally:
        server.terminate()
        server.wait(timeout=20)
    said = out_path.read_text() + err_path.read_text()
    assert said.splitlines() == [STARTED.format(url=url)], said
    assert "for a shared server, use gunicorn as the README shows" in said
    # Not Dash's line (it came twice), nor Flask's banner, nor Werkzeug's warning.
    assert "Dash is running" not in said and "development server. Do not use it" not in said
    assert "Serving Flask app" not in said and "Debug mode" not in said
