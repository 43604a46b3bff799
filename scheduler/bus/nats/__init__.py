"""NATS: the connection, provisioning, the publisher, the puller, the wire paths, frames."""
