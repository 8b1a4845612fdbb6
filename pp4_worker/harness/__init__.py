"""What times the model honestly: the command line, the exactness gate, the timing, guards,
profiles, reports and GPU facts."""
