"""The reuse rule: the wrapper and prepass ninja runs, keys, observation sets, events."""
