"""The tool-call format, the calculator, the sandboxed Python tool and the tool box's outcomes."""

from __future__ import annotations

import threading
import time

import pytest

from m2flow.rewards.deadline import DeadlineRunner, call_with_deadline
from m2flow.rewards.tools.calculator import CalculatorError, evaluate, format_number
from m2flow.rewards.tools.calls import format_call, format_error, format_result, parse_call
from m2flow.rewards.tools.registry import TOOLS, ToolBox


def test_a_well_formed_call_is_parsed_with_text_before_it():
    parsed = parse_call("let me compute <tool>calculator:  123*456 </tool>")
    assert (parsed.status, parsed.name, parsed.argument) == ("call", "calculator", "123*456")
    assert parse_call(format_call("python", "x = 1\nprint(x)")).argument == "x = 1\nprint(x)"


def test_text_without_a_tag_is_no_call():
    assert parse_call("56088").status == "none"
    assert parse_call("").status == "none"


@pytest.mark.parametrize("text, error", [
    ("<tool>calculator: 1+1", "without </tool>"),
    ("1+1</tool>", "</tool> without <tool>"),
    ("<tool>calculator: 1</tool><tool>calculator: 2</tool>", "2 calls in one turn"),
    ("<tool>calculator 1+1</tool>", "no ':' found"),
    ("<tool>Calc-2: 1</tool>", "is not a name"),
    ("<tool>calculator:   </tool>", "empty argument"),
    ("<tool>calculator: 1</tool></tool>", "</tool> without <tool>"),
])
def test_malformed_calls_say_what_is_wrong(text, error):
    parsed = parse_call(text)
    assert parsed.status == "malformed" and error in parsed.error


def test_the_calculator_is_exact_and_evaluates_only_arithmetic():
    assert evaluate("123*456") == 56088
    assert evaluate("-(2 + 3) ** 2 // 4 % 7") == (-(2 + 3) ** 2 // 4) % 7
    assert evaluate("999999999999*999999999999") == 999999999999 * 999999999999  # no float rounding
    assert format_number(evaluate("7/2")) == "3.5" and format_number(evaluate("6/3")) == "2"
    assert format_number(evaluate("1/3")) == "0.3333333333"
    for bad in ["__import__('os').system('true')", "x", "abs(-1)", "'a'*3", "1 < 2", "[1]", "1e308*10",
                "9**9**9", "1/0", "1" * 201, "(1"]:
        with pytest.raises(CalculatorError):
            evaluate(bad)


def test_the_registry_fails_loudly():
    with pytest.raises(ValueError, match="already registered"):
        TOOLS.add("calculator", object)
    with pytest.raises(KeyError, match="valid names: calculator, python"):
        ToolBox.from_names(["search"])


def test_every_kind_of_turn_gets_its_observation_and_count():
    box = ToolBox.from_names(["calculator"])
    assert box.respond("56088").outcome == "none"
    reply = box.respond("<tool>calculator: 123*456</tool>")
    assert (reply.outcome, reply.observation) == ("ok", format_result("56088"))
    assert box.respond("<tool>calculator 1</tool>").observation.startswith("<error>malformed call:")
    unknown = box.respond("<tool>search: cats</tool>")
    assert unknown.outcome == "unknown" and unknown.observation == format_error(
        "unknown tool 'search'; tools: calculator")
    assert box.respond("<tool>calculator: 1/0</tool>").observation == format_error(
        "calculator failed: CalculatorError: division by zero")
    s = box.pop_stats()
    assert (s.turns, s.calls, s.ok, s.malformed, s.unknown, s.errors, s.timeouts) == (5, 2, 1, 1, 1, 1, 0)
    assert s.failures == 3 and box.stats.turns == 0


class _Blocking:
    """An in-process tool that never answers until released."""

    name, description, isolated = "slow", "waits", False

    def __init__(self) -> None:
        self.release = threading.Event()

    def __call__(self, argument: str) -> str:
        self.release.wait()
        return "late"


class _NotText:
    name, description, isolated = "number", "returns an int", False

    def __call__(self, argument: str) -> str:
        return 42  # type: ignore[return-value]


def test_a_tool_past_its_time_limit_and_one_returning_no_text_are_failed_calls():
    slow = _Blocking()
    box = ToolBox([slow, _NotText()], timeout_s=0.2)
    try:
        assert box.respond("<tool>slow: x</tool>").observation == format_error("slow timed out")
        assert box.respond("<tool>number: x</tool>").observation == format_error("number returned int, not text")
        assert (box.stats.timeouts, box.stats.errors) == (1, 1)
    finally:
        slow.release.set()


def test_call_with_deadline_reports_each_ending():
    assert call_with_deadline(int, "7").value == 7
    assert call_with_deadline(int, "x", timeout_s=5).status == "error"
    assert call_with_deadline(int, "x").error.startswith("ValueError")
    with pytest.raises(ValueError, match="timeout_s"):
        call_with_deadline(int, "1", timeout_s=0)


@pytest.fixture(scope="module")
def python_box():
    # Sandboxed wherever the machine allows it; elsewhere the unconfined fallback keeps these checks running.
    box = ToolBox.from_names(["python"], python={"timeout_s": 1.0, "memory_limit_mb": 256, "allow_unsandboxed": True})
    yield box
    box.close()


def test_the_python_tool_prints_and_shows_a_last_expression(python_box):
    assert python_box.respond("<tool>python: print(6*7)\n2**10</tool>").observation == format_result("42\n1024")


def test_the_python_tool_has_no_network(python_box):
    code = ("import socket\ntry:\n    socket.create_connection(('127.0.0.1', 9), timeout=1)\n    print('connected')\n"
            "except OSError:\n    print('refused')")
    assert python_box.respond(f"<tool>python: {code}</tool>").observation == format_result("refused")


def test_the_python_tool_bounds_time_memory_and_reports_errors(python_box):
    assert python_box.respond("<tool>python: while True: pass</tool>").outcome == "timeout"
    memory = python_box.respond("<tool>python: x = bytearray(1024 ** 3)</tool>")
    assert memory.outcome == "error" and "MemoryError" in memory.observation
    raised = python_box.respond("<tool>python: 1/0</tool>")
    assert raised.outcome == "error" and "ZeroDivisionError" in raised.observation
    # State never leaks from one call to the next: each runs in a fresh process.
    python_box.respond("<tool>python: import builtins; builtins.leak = 1</tool>")
    assert "NameError" in python_box.respond("<tool>python: leak</tool>").observation


def test_tool_latency_is_drawn_in_its_range_and_follows_the_seed(monkeypatch):
    waits: list[float] = []
    monkeypatch.setattr("m2flow.rewards.tools.registry.time.sleep", waits.append)
    box = ToolBox.from_names(["calculator"], latency_s=(0.01, 0.05))
    box.seed(7)
    replies = [box.respond(format_call("calculator", "6*7")) for _ in range(200)]
    assert all(r.observation == format_result("42") for r in replies)
    assert len(waits) == 200 and all(0.01 <= w <= 0.05 for w in waits)
    assert min(waits) < 0.015 and max(waits) > 0.045  # varies over the whole range, call to call
    box.seed(7)
    again = [box.latency() for _ in range(200)]
    assert again == waits  # the same seed, the same waits
    waits.clear()
    box.respond("56088")  # a turn without a call waits for nothing
    assert waits == []


def test_without_latency_a_call_never_waits(monkeypatch):
    waits: list[float] = []
    monkeypatch.setattr("m2flow.rewards.tools.registry.time.sleep", waits.append)
    box = ToolBox.from_names(["calculator"])
    box.respond(format_call("calculator", "6*7"))
    assert waits == [] and box.latency() == 0.0


@pytest.mark.parametrize("latency", [(-0.1, 0.2), (0.3, 0.1)])
def test_a_latency_range_that_is_not_low_to_high_raises(latency):
    with pytest.raises(ValueError, match="latency_s"):
        ToolBox.from_names(["calculator"], latency_s=latency)


class _Where:
    """Records the thread each call ran on."""

    name, description, isolated = "where", "records its thread", False

    def __init__(self) -> None:
        self.threads: list[threading.Thread] = []

    def __call__(self, argument: str) -> str:
        self.threads.append(threading.current_thread())
        return argument


def test_in_process_tool_calls_share_one_thread():
    where = _Where()
    box = ToolBox([where])
    assert [box.respond(f"<tool>where: {i}</tool>").outcome for i in range(50)] == ["ok"] * 50
    assert len(where.threads) == 50 and len(set(where.threads)) == 1  # one thread for the 50 calls
    assert where.threads[0] is not threading.current_thread()  # still under the box's time limit
    box.close()


class _Sleepy:
    name, description, isolated = "sleepy", "answers after a pause", False

    def __call__(self, argument: str) -> str:
        time.sleep(float(argument))
        return "late"


def test_under_a_callers_deadline_a_tool_runs_in_place_and_a_late_answer_still_times_out():
    where, sleepy = _Where(), _Sleepy()
    box = ToolBox([where, sleepy], timeout_s=0.1)
    runner = DeadlineRunner(30.0)  # as an environment's step in a TextEnvBatch
    results = runner.run_all([(box.respond, ("<tool>where: a</tool>",)), (threading.current_thread, ()),
                              (box.respond, ("<tool>sleepy: 0.3</tool>",))])
    assert results[0].value.outcome == "ok" and where.threads == [results[1].value]  # no second thread
    assert results[2].value.outcome == "timeout" and box.stats.timeouts == 1
    runner.close()
