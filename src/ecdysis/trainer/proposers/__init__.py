"""Proposers: turn the evidence of one step into a spec (which proposer a method uses: trainer/methods.py)."""

from .analyst import AnalystProposer
from .base import Evidence, Proposal, Proposer, ProposerContext
from .serial import SerialProposer

__all__ = ["AnalystProposer", "Evidence", "Proposal", "Proposer", "ProposerContext", "SerialProposer"]
