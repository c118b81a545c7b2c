"""The unattended commands: timer, pause, run reports and metrics, init, the lock file."""
