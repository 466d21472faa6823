"""The packages that export names lazily (PEP 562) do it one way, through broker.lazy_exports:
each public name resolves to the object its module defines, an unknown name is an
AttributeError naming the package, and nothing is imported before a name is used."""

from __future__ import annotations

import importlib

import pytest

from tests.fresh_interpreter import run_fresh

PACKAGES = ("broker.client", "gazette_consumer.sequencer", "spark_integration")


@pytest.mark.parametrize("package", PACKAGES)
def test_each_name_resolves_and_an_unknown_one_is_an_attribute_error(package: str) -> None:
    from broker.lazy_exports import lazy_getattr

    module = importlib.import_module(package)
    assert module.__getattr__.__qualname__ == lazy_getattr(package, {}).__qualname__
    for name in module.__all__:
        value = getattr(module, name)
        assert value is not None
        defined_in = getattr(value, "__module__", None)
        if defined_in is not None and defined_in.startswith(package):
            assert getattr(importlib.import_module(defined_in), name) is value
    with pytest.raises(AttributeError, match=rf"module '{package}' has no attribute 'no_such'"):
        _ = module.no_such


def test_a_lazy_name_is_imported_only_when_used() -> None:
    code = (
        "import sys, gazette_consumer.sequencer as s\n"
        "before = 'gazette_consumer.sequencer.read_iter' in sys.modules\n"
        "s.ReadCommittedIter\n"
        "print(before, 'gazette_consumer.sequencer.read_iter' in sys.modules)\n"
    )
    assert run_fresh(code) == "False True"


def test_a_resolved_name_becomes_the_packages_own_attribute() -> None:
    # Used per call (`client.append(...)`), a name is resolved once: afterwards it is found in
    # the package's namespace without its __getattr__.
    code = (
        "import broker.client as c\n"
        "before = 'append' in vars(c)\n"
        "first = c.append\n"
        "print(before, vars(c).get('append') is first, c.append is first)\n"
    )
    assert run_fresh(code) == "False True True"
