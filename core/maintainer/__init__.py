"""Maintainer manager, maintainers, span agent and the scheduler placement."""
