"""Exceptions raised by :mod:`hapi_stack`.

Everything the package raises on purpose derives from :class:`StackError`, so a caller (the CLI, a
test fixture) can catch one type and show its message::

    StackError
    ├── MissingBinaryError    memcached or a Swift program is not installed
    ├── PortInUseError        a port the stack needs is taken by another program
    ├── StackStartError       a service died or never became healthy while starting
    └── StackNotRunningError  no running stack is recorded in the state directory
"""

from __future__ import annotations

__all__ = [
    "MissingBinaryError",
    "PortInUseError",
    "StackError",
    "StackNotRunningError",
    "StackStartError",
]


class StackError(Exception):
    """Base class of every error raised by :mod:`hapi_stack`."""


class MissingBinaryError(StackError):
    """A program the stack runs (memcached, a ``swift-*`` server) cannot be found."""

    def __init__(self, program: str, hint: str) -> None:
        self.program = program
        super().__init__(f"{program} not found; {hint}")


class PortInUseError(StackError):
    """A port the stack needs is already bound by something that is not this stack."""

    def __init__(self, host: str, port: int, setting: str) -> None:
        self.host = host
        self.port = port
        self.setting = setting
        flag = "--" + setting.replace("_", "-")
        super().__init__(
            f"port {port} on {host} is already in use by another program; stop it or choose "
            f"another port (StackConfig.{setting}, CLI {flag})"
        )


class StackStartError(StackError):
    """A service exited or did not become healthy in time; carries the tail of its log."""

    def __init__(self, service: str, reason: str, log_tail: str) -> None:
        self.service = service
        self.reason = reason
        self.log_tail = log_tail
        message = f"{service} {reason}"
        if log_tail:
            message += f"; last lines of its log:\n{log_tail}"
        super().__init__(message)


class StackNotRunningError(StackError):
    """No running stack is recorded in the state directory."""
