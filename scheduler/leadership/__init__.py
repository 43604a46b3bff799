"""Leadership: the KV lease, the PostgreSQL epoch, terms of office, heartbeats, clock skew."""
