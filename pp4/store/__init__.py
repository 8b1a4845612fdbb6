"""The content-addressed object store: its local backend and its command line."""
