"""The management API over HTTP (FastAPI: routes, models, problems, the edge guards, tokens,
idempotency, the activity log) and the NATS micro service (`nats_service`), both over
`scheduler.operations`."""
