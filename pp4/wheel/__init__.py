"""Built modules as installable wheels that carry their certificate and check it at import
(contents: what a wheel holds; archive: its reproducible bytes; runtime: the loader it installs)."""
