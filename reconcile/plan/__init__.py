"""The plan stage: probe the machine, compare with the spec, render the drift (and status)."""
