"""What the controller refuses, and the HTTP problem each becomes (``api._domain``).

    ControllerError          401 (a missing or unknown token)
    ├── NotFound             404 an unknown shard, target, plan or file
    ├── Conflict             409 a plan made against a revision another change replaced
    ├── Invalid              422 a change the overrides or the engine refuse (names the field)
    └── Unavailable          503 a follower asked to write (names the leader)

Bad input in a body (a target, a batch entry) is a ``sharder.kernel.errors.SharderError`` and
maps to 422 the same way; store failures are ``store.StoreError``.
"""

from __future__ import annotations


class ControllerError(Exception):
    """Base of what the API maps to problems."""


class NotFound(ControllerError):
    pass


class Conflict(ControllerError):
    def __init__(self, message: str, *, current_version: str) -> None:
        self.current_version = current_version
        super().__init__(message)


class Invalid(ControllerError):
    def __init__(self, message: str, *, field: str = "") -> None:
        self.field = field
        super().__init__(message)


class Unavailable(ControllerError):
    """This replica may not write (not the leader); ``leader`` says who may."""

    def __init__(self, message: str, *, leader: str | None = None) -> None:
        self.leader = leader
        super().__init__(message)
