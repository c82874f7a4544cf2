"""The exception tree of the benchmark harness.

::

    BenchError
      ShapingError          a network namespace, veth or tc command failed
      AgentError            the storage-side agent failed or went away
      ScenarioError         an unknown scenario, a bad option, or a run that produced nothing
"""

from __future__ import annotations

__all__ = ["AgentError", "BenchError", "ScenarioError", "ShapingError"]


class BenchError(Exception):
    """Base class of every error the benchmark harness raises on purpose."""


class ShapingError(BenchError):
    """Setting up or changing the shaped link failed; the message has the command and its output."""

    def __init__(self, command: list[str], output: str) -> None:
        self.command = command
        self.output = output.strip()
        super().__init__(f"`{' '.join(command)}` failed: {self.output or 'no output'}")


class AgentError(BenchError):
    """The storage-side agent (Swift + HAPI server in their own namespace) reported a failure."""


class ScenarioError(BenchError):
    """A scenario cannot run as asked (unknown name, bad option, missing inputs)."""
