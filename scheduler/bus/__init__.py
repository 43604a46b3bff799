"""The broker: the NATS adapter of the engine's ports (`bus.nats`) and its in-memory twin
(`bus.memory`), held to the same contract tests."""
