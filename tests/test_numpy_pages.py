"""numpy's large arrays in 4 KiB pages during a run, unless the user set numpy's own switch
(the CLI's start: tests/cli/test_cli_numpy_env.py)."""

from __future__ import annotations

import pytest

from npusim import numpy_pages
from npusim.numpy_pages import ENV, small_pages

switch = numpy_pages._switch()
pytestmark = pytest.mark.skipif(switch is None, reason="this numpy has no huge-page switch")


@pytest.fixture(autouse=True)
def _restore():
    was = switch(True)
    switch(was)
    yield
    switch(was)


def _now() -> bool:
    """numpy's setting, read by setting it to itself (the switch returns the previous)."""
    was = switch(True)
    switch(was)
    return was


def test_off_inside_the_block_and_back_after(monkeypatch) -> None:
    monkeypatch.delenv(ENV, raising=False)
    for before in (True, False):
        switch(before)
        with small_pages():
            assert _now() is False
        assert _now() is before


def test_back_after_an_error(monkeypatch) -> None:
    monkeypatch.delenv(ENV, raising=False)
    switch(True)
    with pytest.raises(KeyError), small_pages():
        raise KeyError("x")
    assert _now() is True


def test_the_users_switch_is_left_alone(monkeypatch) -> None:
    monkeypatch.setenv(ENV, "1")
    switch(True)
    with small_pages():
        assert _now() is True
