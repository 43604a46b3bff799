"""What crosses the wire: the `hanzo.mq.v1` envelope, producer headers, subject rules."""
