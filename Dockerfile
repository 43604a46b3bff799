# syntax=docker/dockerfile:1
# The daemon image: slim, non-root. Build: docker build -t mq-scheduler .
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY scheduler ./scheduler
RUN pip install --no-cache-dir --prefix=/install .

FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    SCHEDULER_HTTP_HOST=0.0.0.0 \
    SCHEDULER_SCHEDULES_DIR=/app/schedules \
    SCHEDULER_MIGRATIONS_DIR=/app/migrations
RUN groupadd --system --gid 10001 scheduler \
 && useradd --system --uid 10001 --gid scheduler --home-dir /app --shell /usr/sbin/nologin scheduler
COPY --from=build /install /usr/local
WORKDIR /app
COPY migrations ./migrations
COPY schedules ./schedules
USER 10001:10001
EXPOSE 8055 9090
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s \
  CMD ["python", "-c", "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:8055/healthz', timeout=2); sys.exit(0)"]
ENTRYPOINT ["scheduler"]
CMD ["run"]
