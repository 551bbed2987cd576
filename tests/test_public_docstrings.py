"""Every public callable of the package documents what it refuses.

The project's rule: public docstrings give shapes, dtypes, units, the errors raised and the source.
This test holds the part a machine can check: every public function or class (the ``__all__`` of
each public module) that takes an argument has a ``Raises:`` section. Exceptions, protocols and
abstract policies, and callables without arguments, are exempt.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import typing

import pytest

import attn_gym_lite


def _public_modules() -> list[str]:
    """Every module of the package that declares ``__all__`` (its public names), found by walking
    the package: a new public module is covered without being listed here."""
    names = []
    for info in pkgutil.walk_packages(attn_gym_lite.__path__, prefix="attn_gym_lite."):
        if info.name.endswith("__main__"):
            continue
        if "__all__" in vars(importlib.import_module(info.name)):
            names.append(info.name)
    return names


PUBLIC_MODULES = _public_modules()


def _public_callables():
    seen = {}
    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        for name in getattr(module, "__all__", [n for n in dir(module) if not n.startswith("_")]):
            obj = getattr(module, name, None)
            if not (inspect.isfunction(inspect.unwrap(obj)) or inspect.isclass(obj)):  # lru_cache etc. too
                continue
            if not getattr(obj, "__module__", "").startswith("attn_gym_lite"):
                continue
            seen.setdefault(f"{obj.__module__}.{obj.__qualname__}", obj)
    return seen


def _takes_arguments(obj) -> bool:
    if inspect.isclass(obj):
        if issubclass(obj, BaseException) or getattr(obj, "_is_protocol", False) or inspect.isabstract(obj):
            return False
        if typing.is_typeddict(obj):
            return False
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError):
        return False
    return any(p.name != "self" for p in signature.parameters.values())


PUBLIC = _public_callables()
# Result records the package builds and returns; users read them, they do not construct them.
RECORDS = {
    "attn_gym_lite.isolation.ProcessRun": "what run_process_group returns",
    "attn_gym_lite.profiling.record.GraphAnnotations": "what record_annotations returns",
    "attn_gym_lite.data.study.PackingStats": "what packing_stats returns",
}


def test_the_scan_finds_the_public_api():
    assert len(PUBLIC) > 100  # the package's public callables; a broken scan finds none
    assert set(RECORDS) <= set(PUBLIC), "an exempt record is no longer public: drop it from RECORDS"


@pytest.mark.parametrize("name", sorted(n for n, obj in PUBLIC.items() if _takes_arguments(obj) and n not in RECORDS))
def test_public_callable_documents_what_it_raises(name):
    doc = inspect.getdoc(PUBLIC[name]) or ""
    assert "Raises:" in doc or "Raises\n" in doc, f"{name}: its docstring has no Raises: section"
