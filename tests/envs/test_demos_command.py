"""``m2flow demos``: a file of scripted-expert demonstrations that loads; bad input is one error line."""

from __future__ import annotations

import numpy as np
import pytest

from m2flow.cli import main
from m2flow.envs.metaworld import metaworld_unavailable_reason
from m2flow.envs.metaworld_demos import Demos

REASON = metaworld_unavailable_reason()


def _error_line(capsys, code: int) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    return err[0]


@pytest.mark.skipif(REASON is not None, reason=f"MetaWorld pixels unavailable: {REASON}")
def test_demos_of_a_task_outside_mt10_are_written_and_load(tmp_path, capsys):
    out = tmp_path / "hp.npz"
    code = main(["demos", "handle-press-v3", "--episodes", "1", "--image-size", "16", "--seed", "7", "-o", str(out)])
    assert code == 0, capsys.readouterr().err
    assert f"{out}: 1 episodes" in capsys.readouterr().out
    demos = Demos.load(out)
    assert demos.tasks.tolist() == ["handle-press-v3"] and demos.seeds.tolist() == [7] and demos.success.all()
    assert demos.obs.shape == (len(demos.actions), 16 * 16 * 3 + 16 + 16) and np.abs(demos.actions).max() <= 1


@pytest.mark.parametrize("args, words", [
    (["fly-v3"], "error: env.env_id: no instruction for task 'fly-v3'; give one"),
    (["reach-v3", "--episodes", "0"], "error: --episodes must be >= 1"),
    (["reach-v3", "--action-noise", "-1"], "error: --action-noise must be >= 0"),
    (["reach-v3,push-v3", "--instruction", "do it"], "error: env.env_kwargs.instruction: one sentence for 2 tasks"),
])
def test_bad_input_is_one_error_line(tmp_path, capsys, args, words):
    line = _error_line(capsys, main(["demos", *args, "-o", str(tmp_path / "d.npz")]))
    assert line.startswith(words), line
    assert not (tmp_path / "d.npz").exists()


def test_the_output_must_be_an_npz_file(tmp_path, capsys):
    line = _error_line(capsys, main(["demos", "reach-v3", "-o", str(tmp_path / "d.txt")]))
    assert line == f"error: --output: {tmp_path / 'd.txt'} must end in .npz"
