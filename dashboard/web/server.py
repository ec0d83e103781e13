"""Building and serving the Dash app, from command-line options or DASHBOARD_* variables.

    python app.py serve --trial s3://bucket/job/profiler-output --cache-dir /var/cache/dash
    DASHBOARD_CACHE_DIR=/var/cache/dash gunicorn -w 4 app:server

Every server process (and every gunicorn worker) given the same cache folder shares the
loaded trials and the background-callback jobs. The Dash debugger is off unless a
developer passes --dev-debug.
"""
from __future__ import annotations

import argparse
import functools
import logging
import os
from dataclasses import dataclass, field

import dash

from .cache import JOBS_FOLDER, ForkSafeCache, TrialCache, default_cache_dir
from .callbacks import Context, register_callbacks
from .layout import build_layout
from .options import DEFAULT_MAX_EVENTS, DEFAULT_MAX_TRIAL_MB, MB, limit

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SAMPLE_TRIAL = os.path.join(REPO_ROOT, "examples", "sample-trial", "trial")
ASSETS = os.path.join(REPO_ROOT, "assets")
TITLE = "DataLoader Profiler"
MAX_REQUEST_BYTES = 10 * 2**20

log = logging.getLogger("dashboard.web")


@dataclass
class ServerOptions:
    trial: str | None = None
    host: str = "127.0.0.1"
    port: int = 8050
    cache_dir: str | None = None
    cache_size_mb: int = 2048
    data_roots: list[str] = field(default_factory=list)
    s3_buckets: list[str] | None = None
    dev_debug: bool = False
    max_trial_mb: int = DEFAULT_MAX_TRIAL_MB  # 0: no limit
    max_events: int = DEFAULT_MAX_EVENTS  # 0: no limit

    @property
    def max_bytes(self) -> int | None:
        return self.max_trial_mb * MB if self.max_trial_mb else None

    @property
    def max_events_limit(self) -> int | None:
        return self.max_events or None

    @property
    def default_trial(self) -> str:
        return self.trial or SAMPLE_TRIAL

    def allowed_roots(self) -> list[str]:
        """Local folders trials may be opened from: the configured roots (default: the
        working directory), plus the bundled sample and the trial opened at start."""
        roots = list(self.data_roots) or [os.getcwd()]
        roots.append(os.path.dirname(SAMPLE_TRIAL))
        if self.trial and not self.trial.startswith("s3://"):
            roots.append(self.trial)
        return [os.path.abspath(os.path.expanduser(r)) for r in roots]


def options_from_args(args) -> ServerOptions:
    return ServerOptions(trial=args.trial, host=args.host, port=args.port, cache_dir=args.cache_dir,
                         cache_size_mb=args.cache_size_mb, data_roots=list(args.data_root or []),
                         s3_buckets=args.s3_bucket, dev_debug=bool(args.dev_debug),
                         max_trial_mb=args.max_trial_mb, max_events=args.max_events)


def _split(value: str | None, sep: str) -> list[str]:
    return [part.strip() for part in (value or "").split(sep) if part.strip()]


def _limit(environ, name: str, default: int) -> int:
    """A size limit from the environment, read as the command line reads one."""
    text = (environ.get(name) or "").strip()
    try:
        return limit(text) if text else default
    except argparse.ArgumentTypeError as exc:
        raise ValueError(f"{name}: {exc}") from None


def options_from_environment(environ=None) -> ServerOptions:
    """DASHBOARD_TRIAL, DASHBOARD_CACHE_DIR, DASHBOARD_CACHE_SIZE_MB, DASHBOARD_DATA_ROOTS
    (os.pathsep-separated), DASHBOARD_S3_BUCKETS (comma-separated), DASHBOARD_MAX_TRIAL_MB,
    DASHBOARD_MAX_EVENTS (0: no limit). The debugger is never turned on from the environment."""
    environ = os.environ if environ is None else environ
    buckets = _split(environ.get("DASHBOARD_S3_BUCKETS"), ",")
    return ServerOptions(trial=environ.get("DASHBOARD_TRIAL") or None,
                         cache_dir=environ.get("DASHBOARD_CACHE_DIR") or None,
                         cache_size_mb=int(environ.get("DASHBOARD_CACHE_SIZE_MB") or 2048),
                         data_roots=_split(environ.get("DASHBOARD_DATA_ROOTS"), os.pathsep),
                         s3_buckets=buckets or None,
                         max_trial_mb=_limit(environ, "DASHBOARD_MAX_TRIAL_MB", DEFAULT_MAX_TRIAL_MB),
                         max_events=_limit(environ, "DASHBOARD_MAX_EVENTS", DEFAULT_MAX_EVENTS))


def create_app(options: ServerOptions) -> dash.Dash:
    cache_dir = os.path.abspath(os.path.expanduser(options.cache_dir or default_cache_dir()))
    trials = TrialCache(cache_dir, options.cache_size_mb)
    jobs = ForkSafeCache(os.path.join(cache_dir, JOBS_FOLDER))
    app = dash.Dash(__name__, title=TITLE, assets_folder=ASSETS, update_title=None,
                    background_callback_manager=dash.DiskcacheManager(jobs),
                    suppress_callback_exceptions=False,
                    on_error=lambda exc: log.error("a callback failed; its outputs are left unchanged",
                                                   exc_info=exc))
    # Callback requests are small JSON documents; refuse bodies that could only be abuse.
    app.server.config["MAX_CONTENT_LENGTH"] = MAX_REQUEST_BYTES
    # A cheap liveness probe for the container's HEALTHCHECK and load balancers.
    app.server.add_url_rule("/healthz", "healthz", lambda: ("ok\n", 200, {"Content-Type": "text/plain"}))
    app.layout = build_layout(options.default_trial)
    register_callbacks(app, Context(cache=trials, default_trial=options.default_trial,
                                    roots=options.allowed_roots(), s3_buckets=options.s3_buckets,
                                    max_bytes=options.max_bytes, max_events=options.max_events_limit))
    return app


def serve(args) -> int:
    options = options_from_args(args)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    app = create_app(options)
    if options.dev_debug:
        log.warning("--dev-debug: the Dash debugger is on; anyone who can reach %s:%s can run code",
                    options.host, options.port)
    app.run(host=options.host, port=options.port, debug=options.dev_debug)
    return 0


@functools.lru_cache(maxsize=1)
def server_from_environment():
    """The Flask server for `gunicorn app:server`, configured from DASHBOARD_* variables."""
    return create_app(options_from_environment()).server
