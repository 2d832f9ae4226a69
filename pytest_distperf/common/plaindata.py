"""Records as plain data: a JSON-ready tree out of frozen dataclasses, and back (by the
type hints).  Standard library only; :mod:`pytest_distperf.records` re-exports both."""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, TypeVar

T = TypeVar("T")


def to_dict(record: Any) -> Any:
    """A JSON-ready structure (dicts, lists, str, numbers, None) for a record tree.

    Fields marked ``metadata={"transient": True}`` (callables, live handles) are left out.
    """
    if dataclasses.is_dataclass(record) and not isinstance(record, type):
        return {f.name: to_dict(getattr(record, f.name)) for f in dataclasses.fields(record)
                if not f.metadata.get("transient")}
    if isinstance(record, dict):
        return {str(k): to_dict(v) for k, v in record.items()}
    if isinstance(record, (list, tuple)):
        return [to_dict(v) for v in record]
    if isinstance(record, str) and type(record) is not str:
        return str(record)  # torch's TorchVersion: plain data serialisers (execnet) refuse it
    return record


def from_dict(cls: type[T], data: Any) -> T:
    """Rebuild a record of type ``cls`` from :func:`to_dict`'s output."""
    return typing.cast(T, _build(cls, data))


def _build(tp: Any, data: Any) -> Any:
    if data is None:
        return None
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Union or str(origin) == "<class 'types.UnionType'>":
        non_none = [a for a in args if a is not type(None)]
        return _build(non_none[0], data) if len(non_none) == 1 else data
    if dataclasses.is_dataclass(tp):
        upgrade = getattr(tp, "upgrade_dict", None)
        if upgrade is not None:  # a record whose JSON layout changed reads its older ones
            data = upgrade(data)
        hints = typing.get_type_hints(tp)
        kwargs = {
            f.name: _build(hints[f.name], data[f.name])
            for f in dataclasses.fields(tp)
            if f.name in data
        }
        return typing.cast(Any, tp)(**kwargs)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_build(args[0], v) for v in data)
        return tuple(_build(a, v) for a, v in zip(args, data, strict=True))
    if origin is list:
        return [_build(args[0], v) for v in data]
    if origin is dict:
        return {_build(args[0], k) if args[0] is not str else k: _build(args[1], v)
                for k, v in data.items()}
    if tp is float and isinstance(data, int):
        return float(data)
    return data
