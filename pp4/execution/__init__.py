"""Running one compile or link: the build's limits, the fixed execution root, the observer of file
accesses. Hands back what ran and what it touched (pp4/execution/run.py); what that means for reuse
is pp4/reuse's."""
