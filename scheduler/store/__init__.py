"""The system of record: PostgreSQL (`store.postgres`) and the in-memory twins of its ports, the
engine's (`store.memory`) and the operator half's (`store.memory_*`), held to the same contract
tests."""
