# syntax=docker/dockerfile:1
# Two images from one file (docs/deploy.md):
#   docker build --target daemon -t mq-scheduler:0.1.0 .        the daemon: slim, non-root
#   docker build --target audit  -t mq-scheduler:0.1.0-audit .  adds a JRE, PySpark and the
#                                                                 PostgreSQL JDBC driver for
#                                                                 `scheduler audit`
# A plain `docker build .` builds the daemon (the last stage).
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

FROM ${PYTHON_IMAGE} AS base
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN groupadd --system --gid 10001 scheduler \
 && useradd --system --uid 10001 --gid scheduler --home-dir /app --shell /usr/sbin/nologin scheduler

FROM base AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY scheduler ./scheduler
RUN pip install --no-cache-dir --prefix=/install .

FROM base AS build-audit
WORKDIR /src
COPY pyproject.toml README.md ./
COPY scheduler ./scheduler
RUN pip install --no-cache-dir --prefix=/install "./[audit]"

# The audit image: `scheduler audit --date D --input jdbc:postgresql://... --out DIR`.
FROM base AS audit
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      "openjdk-17-jre-headless=17.0.*" \
      "libpostgresql-jdbc-java=42.5.*" \
 && rm -rf /var/lib/apt/lists/*
ENV SCHEDULER_SCHEDULES_DIR=/app/schedules \
    SCHEDULER_MIGRATIONS_DIR=/app/migrations \
    SPARK_LOCAL_IP=127.0.0.1 \
    HOME=/tmp
COPY --from=build-audit /install /usr/local
WORKDIR /app
COPY migrations ./migrations
COPY schedules ./schedules
USER 10001:10001
# A batch job: Kubernetes (or the caller) watches its exit status, nothing serves a probe.
HEALTHCHECK NONE
ENTRYPOINT ["scheduler"]
CMD ["audit", "--help"]

# The daemon image (default target).
FROM base AS daemon
ENV SCHEDULER_HTTP_HOST=0.0.0.0 \
    SCHEDULER_SCHEDULES_DIR=/app/schedules \
    SCHEDULER_MIGRATIONS_DIR=/app/migrations
COPY --from=build /install /usr/local
WORKDIR /app
COPY migrations ./migrations
COPY schedules ./schedules
USER 10001:10001
EXPOSE 8055 9090
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
  CMD ["python", "-c", "import os,urllib.request; urllib.request.urlopen('http://127.0.0.1:' + os.environ.get('SCHEDULER_HTTP_PORT', '8055') + '/healthz', timeout=2)"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["scheduler"]
CMD ["run"]
