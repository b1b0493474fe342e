"""The alert source matches a selector's series once and again only when new series appear (issue 28:
every rule asks every evaluation); what it answers is what matching every time would answer."""

from __future__ import annotations

import pytest

from gpulens.alerts.expr import Selector, parse_expr, walk
from gpulens.alerts.source import StoreSource


def _selector(text: str) -> Selector:
    (sel,) = walk(parse_expr(text).root, Selector)
    return sel


def test_a_selector_sees_series_created_after_its_first_answer_once_the_source_refreshes(store):
    store.series_id("gpu_temperature_celsius", {"gpu": "0", "host": "a"})
    store.series_id("gpu_temperature_celsius", {"gpu": "1", "host": "b"})
    source = StoreSource(store)
    source.refresh()
    sel = _selector('gpu_temperature_celsius{host="a"} > 80')
    assert [s.labels["gpu"] for s in source.series(sel)] == ["0"]
    store.series_id("gpu_temperature_celsius", {"gpu": "2", "host": "a"})
    source.refresh()
    assert [s.labels["gpu"] for s in source.series(sel)] == ["0", "2"]
    assert [s.labels["gpu"] for s in source.series(_selector("gpu_temperature_celsius > 80"))] == ["0", "1", "2"]


def test_changing_an_answer_does_not_change_the_next(store):
    store.series_id("gpu_power_watts", {"gpu": "0"})
    source = StoreSource(store)
    source.refresh()
    sel = _selector("gpu_power_watts > 1")
    first = source.series(sel)
    with pytest.raises(AttributeError):  # the cached answer is a tuple: no caller can change it
        first.clear()  # type: ignore[attr-defined]
    assert len(source.series(sel)) == 1
