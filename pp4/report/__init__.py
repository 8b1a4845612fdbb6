"""What a user sees of a build: progress lines while it runs, a report of what it did."""
