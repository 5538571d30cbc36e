"""Placeholder (issue 6): filled in by the CLAN / DistributedOptimizer work."""

__all__ = []
