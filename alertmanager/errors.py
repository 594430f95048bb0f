"""Exceptions raised by the Alertmanager config side (the relay has its own tree).

    AlertmanagerError
    ├── AlertingError     an ``alerting`` spec section that does not validate; also a
    │                     ``sharder.kernel.errors.SpecError`` (field, value, file) and a ValueError
    │                     so a pydantic validator may raise it and ``parse_model`` maps it
    └── AmtoolError       amtool rejected a rendered config, failed or could not be run

Every message names the field or file and says what to change.
"""

from __future__ import annotations

from sharder.kernel.errors import SpecError


class AlertmanagerError(Exception):
    """Base class for errors raised by ``alertmanager`` outside the relay."""


class AlertingError(AlertmanagerError, SpecError, ValueError):
    """Bad alerting spec; formats like ``SpecError`` ("field 'x' message (value v)")."""


class AmtoolError(AlertmanagerError):
    def __init__(self, message: str, *, path: str = "") -> None:
        self.path = path
        self.reason = message
        super().__init__(f"{path}: {message}" if path else message)
