# The fsdp-planner service: API + embedded migrations, without torch (the web process never imports it).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app
COPY pyproject.toml README.md ./
COPY contract ./contract
COPY planner ./planner
COPY executor ./executor
COPY api ./api
COPY migrations ./migrations
RUN pip install . \
    && useradd --create-home --uid 10001 planner \
    && mkdir /data && chown planner /data

USER planner
# Where the embedded SQLite file lives when DATABASE_URL is not set.
ENV FSDP_PLANNER_DATA_DIR=/data
VOLUME ["/data"]
EXPOSE 8000

HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/readyz', timeout=2)"]

# Migrates the database, then serves on all interfaces of the container.
CMD ["fsdp-planner", "serve", "--host", "0.0.0.0", "--port", "8000"]
