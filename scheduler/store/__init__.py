"""The system of record: PostgreSQL (`store.postgres`) and the in-memory twin of its engine
port (`store.memory`), held to the same contract tests."""
