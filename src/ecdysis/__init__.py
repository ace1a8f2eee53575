"""Ecdysis: train the runtime harness of an LLM agent from recurring failures."""

__version__ = "0.1.0"
