"""Compiles that missed the store, run on a Ray cluster (executor: the build machine's side;
node: what a node runs). The keys, the store and the proof are the local build's."""
