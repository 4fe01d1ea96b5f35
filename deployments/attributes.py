"""What a class's instances are given: how the fences of Ray's and vLLM's internals check that a
private attribute they read is still set."""

from __future__ import annotations

import dataclasses
import inspect


def attributes_set(cls: type) -> set[str]:
    """A class's fields and every `self.<name>` its methods (and its bases') mention."""
    names = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
    for klass in cls.__mro__:
        for member in vars(klass).values():
            function = getattr(member, "fget", member)
            if inspect.isfunction(function):
                names.update(function.__code__.co_names)
    return names
