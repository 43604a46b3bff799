"""Leadership: the JetStream KV lease, terms of office one after another, the tenure the engine
sees, heartbeats, clock skew. The fencing epoch itself is PostgreSQL's
(`scheduler.store.postgres.epoch`)."""
