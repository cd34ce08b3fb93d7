"""How sequence and optional values are represented in the engine.

A sequence value is a Python ``list`` of arrays. An optional value is its content (array or
list) or :data:`NONE_OPTIONAL` when empty; an omitted input is plain ``None``.
"""

from __future__ import annotations


class _NoneOptional:
    _instance = None

    def __new__(cls):
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "NONE_OPTIONAL"

    def __bool__(self) -> bool:
        return False


NONE_OPTIONAL = _NoneOptional()


def from_engine(value):
    """Engine value -> user value (empty optionals become None)."""
    if value is NONE_OPTIONAL:
        return None
    if isinstance(value, list):
        return [from_engine(v) for v in value]
    return value
