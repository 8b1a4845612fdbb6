"""From sources to build.ninja: torch's flags, each module's compile plan, the ninja file, the
limits every compile and link runs under."""
