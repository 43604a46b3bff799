"""PostgreSQL, the system of record: the engine's statements and the operators' queries."""
