"""What runs unattended: the timer, the pause, the run reports and metrics."""
