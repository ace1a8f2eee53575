"""The agent loop that drives harness layers, and the trajectory it records."""
