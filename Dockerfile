# The dashboard under gunicorn. Same install steps as the README; no test dependencies.
FROM python:3.11-slim

# The page answers to the names of the host's loopback, where the README publishes the port (a
# page elsewhere that points its own name there is refused: DNS rebinding); published under
# another name, set DASHBOARD_ALLOWED_HOSTS to it.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    DASHBOARD_CACHE_DIR=/cache \
    DASHBOARD_DATA_ROOTS=/data \
    DASHBOARD_ALLOWED_HOSTS=localhost,127.0.0.1,[::1]

WORKDIR /app
COPY requirements.txt .
RUN pip install --no-cache-dir -r requirements.txt

COPY app.py ./
COPY dashboard ./dashboard
COPY assets ./assets
COPY examples ./examples

# The cache holds pickles: private to the server's user (as the app makes its default folder).
RUN useradd --create-home --uid 10001 dashboard \
    && mkdir -p /cache /data \
    && chown 10001:10001 /cache /data \
    && chmod 0700 /cache
USER 10001:10001

VOLUME ["/cache"]
EXPOSE 8050
HEALTHCHECK --interval=30s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8050/healthz', timeout=4)"]

# Inside the container the app must listen on all interfaces; publish the port on the
# host's loopback (docker run -p 127.0.0.1:8050:8050) unless it is meant to be shared.
# The worker class reads each request whole before a thread runs it: slow clients cannot hold
# the threads (dashboard/serving.py).
CMD ["gunicorn", "--worker-class", "dashboard.serving.BufferingWorker", "--workers", "3", "--threads", "4", \
     "--timeout", "120", "--bind", "0.0.0.0:8050", "app:server"]
