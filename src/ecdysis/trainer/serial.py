"""The `serial` baseline now lives in `proposers/serial.py` (its proposer) and `engine.py` (its loop)."""

from .proposers.serial import SerialProposer, single_failure_pattern

__all__ = ["SerialProposer", "single_failure_pattern"]
