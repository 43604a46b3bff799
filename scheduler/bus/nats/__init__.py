"""NATS: the connection, provisioning, the two publishers (the wire and plain nats-py, sharing
`inflight`), the puller, the wire paths, frames, and the events the connection reports."""
