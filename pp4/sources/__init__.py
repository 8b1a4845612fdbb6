"""The extensions' sources and flags: extension specs, exllamav3 (stock and the facc patch), P2P."""
