"""Local Ray start-up: a missed start-up deadline is retried, anything else is raised at once."""

from __future__ import annotations

import pytest
import ray

from m2flow.runtime import cluster as cluster_mod


def _fake_init(outcomes: list[BaseException | None], calls: list[dict]):
    def init(**kwargs):
        calls.append(kwargs)
        outcome = outcomes.pop(0)
        if outcome is not None:
            raise outcome
    return init


def test_missed_startup_deadline_is_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[dict] = []
    shutdowns: list[int] = []
    monkeypatch.setattr(ray, "init", _fake_init(
        [Exception("The current node timed out during startup."), None], calls))
    monkeypatch.setattr(ray, "shutdown", lambda: shutdowns.append(1))
    cluster_mod._start_local_ray({"num_cpus": 2})
    assert calls == [{"num_cpus": 2}, {"num_cpus": 2}]
    assert shutdowns == [1]


def test_other_startup_errors_are_not_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[dict] = []
    monkeypatch.setattr(ray, "init", _fake_init([ValueError("bad num_cpus")], calls))
    with pytest.raises(ValueError, match="bad num_cpus"):
        cluster_mod._start_local_ray({"num_cpus": -1})
    assert len(calls) == 1


def test_retries_give_up_after_the_last_attempt(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[dict] = []
    timeout = "The current node timed out during startup."
    monkeypatch.setattr(ray, "init", _fake_init([Exception(timeout)] * 3, calls))
    monkeypatch.setattr(ray, "shutdown", lambda: None)
    with pytest.raises(Exception, match="timed out during startup"):
        cluster_mod._start_local_ray({})
    assert len(calls) == cluster_mod._STARTUP_ATTEMPTS
