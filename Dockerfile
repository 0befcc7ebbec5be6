# Herald: one image for every process (SPEC §1). docker-compose.yml runs it four ways:
#   python manage.py migrate | gunicorn config.wsgi | celery -A config worker | celery -A config beat
# The default command is the API.
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PROMETHEUS_MULTIPROC_DIR=/var/run/herald-metrics

WORKDIR /app

# Dependencies first, so that a code change does not reinstall them.
COPY requirements.lock ./
RUN pip install -r requirements.lock

COPY . .

# Run as an unprivileged user. The metrics directory is created here, owned by that user, so a
# named volume mounted on it starts with the same owner (Docker copies it into an empty volume).
RUN useradd --system --uid 10001 --user-group --home-dir /app --no-create-home --shell /usr/sbin/nologin herald \
 && mkdir -p "$PROMETHEUS_MULTIPROC_DIR" \
 && chown herald:herald "$PROMETHEUS_MULTIPROC_DIR"
USER herald

EXPOSE 8000
CMD ["gunicorn", "config.wsgi", "--bind", "0.0.0.0:8000", "--access-logfile", "-"]
