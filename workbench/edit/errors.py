"""The error an edit raises when it is refused (the session is left as it was)."""

from __future__ import annotations

from workbench.errors import WorkbenchError


class EditError(WorkbenchError, ValueError):
    """An edit cannot be made: a bad request (unknown node, name clash, a node others need,
    a shape that cannot work) or an edited model that fails its checks. The message says what
    and where; the session is unchanged. ``check`` holds the failed check, when one ran."""

    def __init__(self, message: str, *, check=None):
        self.check = check
        super().__init__(message)
