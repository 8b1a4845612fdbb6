"""What a user sees of a build while and after it runs: progress lines."""
