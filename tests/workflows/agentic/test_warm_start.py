"""The agentic warm start: each task's teacher, written as the episodes will be, and a run that uses it."""

from __future__ import annotations

import json

import pytest

from m2flow.config.errors import ConfigError
from m2flow.workflows.agentic.warm_start import SETTINGS_FILE, WARM_START_DIR, demonstrations
from m2flow.autoplan.entry import train
from m2flow.workflows.agentic.workflow import WORKFLOW as AGENTIC
from tests.workflows.agentic.setup import tiny_config


def test_guess_number_demonstrations_follow_the_env_settings_stop_string_and_templates(tmp_path):
    cfg = tiny_config(tmp_path, **{"env.kwargs": {"high": 20, "max_turns": 5}, "rollout.stop": [";"],
                                   "rollout.observation_template": " {observation} ",
                                   "model.warm_start.mistake_rate": 0.0})
    demos = demonstrations(cfg, 50)
    assert all(d.prompt == "guess 1-20:" and d.correct for d in demos)
    assert all(t.endswith(";") for d in demos for t in d.turns[::2])
    assert all(t in (" higher ", " lower ") for d in demos for t in d.turns[1::2])
    assert max(len(d.turns[::2]) for d in demos) == 5  # bisection on 1-20 needs up to 5 guesses


def test_calculator_demonstrations_come_from_the_calculator_teacher(tmp_path):
    cfg = tiny_config(tmp_path, **{"env.name": "calculator", "env.kwargs": {}, "model.warm_start.skip_rate": 1.0,
                                   "model.warm_start.copy_error_rate": 0.0})
    assert {d.kind for d in demonstrations(cfg, 20)} == {"skip"}


def test_a_warm_start_for_an_environment_without_a_teacher_fails_naming_the_teachers(tmp_path):
    with pytest.raises((ConfigError, ValueError), match="no teacher demonstrates 'test_faulty'.*guess_number"):
        tiny_config(tmp_path, **{"env.name": "test_faulty", "env.kwargs": {}, "model.warm_start.steps": 5})


def test_a_guess_number_run_starts_from_its_warm_start(tmp_path):
    cfg = tiny_config(tmp_path, steps=1, **{"model.warm_start.steps": 5, "model.warm_start.batch_size": 4})
    result = train(AGENTIC, cfg)
    saved = tmp_path / "run" / WARM_START_DIR
    assert json.loads((saved / SETTINGS_FILE).read_text())["env"] == "guess_number"
    assert len(result.history) == 1
