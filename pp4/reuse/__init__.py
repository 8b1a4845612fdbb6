"""The reuse rule: the wrapper and prepass ninja runs, action keys, input sets, probes, events."""
