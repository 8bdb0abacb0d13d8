"""Answers in LaTeX and chat forms, right and wrong, for the math-reward tests and benchmark.

Each case is (form, response, reference, right): ``right`` says whether the response's final answer
equals the reference. The wrong cases all contain the reference's number somewhere (an interval
bound, another variable, a partial result, a percentage of it), so a verifier that looks for the
number instead of reading the answer fails them.
"""

from __future__ import annotations

from typing import NamedTuple


class Case(NamedTuple):
    form: str
    response: str
    reference: str
    right: bool


_CHAT = (
    "Let's work through this step by step.\n\n"
    "First, the price of one notebook is $3, so 12 notebooks cost $12 \\times 3 = 36$ dollars.\n"
    "Then the backpacks: 4 of them at $275 each is $4 \\times 275 = 1100$ dollars.\n"
    "Adding shipping of 114 dollars gives the total.\n\n"
)

CASES: tuple[Case, ...] = (
    # Fractions: \frac, \dfrac, \tfrac, the shorthand \frac13, a slash, a decimal of the same value.
    Case("fraction", r"The probability is $\frac{1}{3}$.", r"\frac13", True),
    Case("fraction", r"So the ratio is $\dfrac{5}{8}$.", r"\frac{5}{8}", True),
    Case("fraction", r"which gives \(\tfrac{7}{2}\)", "3.5", True),
    Case("fraction", r"Hence $x = \frac34$", r"\dfrac{3}{4}", True),
    Case("fraction", "The answer is 3/4.", r"\frac{3}{4}", True),
    Case("fraction", r"$\frac{2}{4}$", r"\frac{1}{2}", True),
    Case("fraction", r"$\frac{3}{4}$", r"\frac{4}{3}", False),
    Case("fraction", r"$\frac{1}{3}$ of the cake was eaten, so $\frac{2}{3}$ is left.", r"\frac13", False),
    # \left( \right) and other wrappers.
    Case("left-right", r"The point is $\left( 2, -1 \right)$.", "(2, -1)", True),
    Case("left-right", r"$\left( \frac{1}{2} \right)^2 = \frac14$", r"\frac{1}{4}", True),
    Case("left-right", r"The point is $\left( -1, 2 \right)$.", "(2, -1)", False),
    # Units in \text{}.
    Case("units", r"The length is $12\text{ cm}$.", "12", True),
    Case("units", r"It takes $45 \text{ minutes}$.", r"45\text{ min}", True),
    Case("units", r"The area is $9 \text{ m}^2$.", "9", True),
    Case("units", r"The area is $12\text{ cm}$ by $9 \text{ cm}$.", "12", False),
    # x = ... forms.
    Case("x =", r"Solving, we get $x = 7$.", "7", True),
    Case("x =", r"Solving, we get $x = 7$.", "x = 7", True),
    Case("x =", r"Therefore $y=\dfrac{5}{3}$.", r"\frac{5}{3}", True),
    Case("x =", r"Solving, we get $y = 7$.", "x = 7", False),
    Case("x =", r"Then $x = 7$ or $x = -2$.", "7", False),
    # Intervals and sets.
    Case("interval/set", r"The solution set is $(-\infty, 2]$.", r"(-\infty, 2]", True),
    Case("interval/set", r"so $x \in \left[ 1, 5 \right)$", "[1, 5)", True),
    Case("interval/set", r"The roots are $\{3, -1\}$.", r"\{-1, 3\}", True),
    Case("interval/set", r"The solution set is $(-\infty, 2)$.", r"(-\infty, 2]", False),
    Case("interval/set", r"The solution set is $(0, 18]$.", "18", False),
    Case("interval/set", r"so $x \geq 18$", "18", False),
    Case("interval/set", r"The roots are $\{18, 19\}$.", "18", False),
    # Percentages.
    Case("percent", r"The discount is $25\%$.", "25", True),
    Case("percent", "That is an increase of 40%.", "40", True),
    Case("percent", "That is 0.4 of the total.", r"40\%", True),
    Case("percent", "The answer is 45%.", "40", False),
    # Thousands separators.
    Case("thousands", "The company earned $1,234,567 in total.", "1234567", True),
    Case("thousands", r"The answer is $12{,}500$.", "12500", True),
    Case("thousands", r"So the total is $1,\!250$ dollars.", "1250", True),
    Case("thousands", "The company earned $1,234,568 in total.", "1234567", False),
    # Long chat-style responses whose last sentence states the answer, followed by other text.
    Case("chat", _CHAT + "So the total cost is $1,250. Let me know if you need anything else!", "1250", True),
    Case("chat", _CHAT + "The final answer is $1250$. I hope it is correct.", "#### 1,250", True),
    Case("chat", _CHAT + r"Therefore the answer is \boxed{1250}.", "1250", True),
    Case("chat", _CHAT + "Adding these, the total comes to 1,250 dollars.", r"\boxed{1250}", True),
    # Wrong: the reference number appears, but as a partial result or not at the end.
    Case("chat", _CHAT + "So the notebooks alone cost 36, and with everything 1,136 dollars.", "36", False),
    Case("chat", _CHAT + "The total cost is $1,150. Let me know if you need anything else!", "1250", False),
    Case("chat", "After the first week she has 12 stamps; after the second, 24.", "12", False),
    # Other symbolic forms.
    Case("symbolic", r"The side is $2\sqrt{2}$.", r"\sqrt{8}", True),
    Case("symbolic", r"The angle is $\frac{\pi}{2}$.", r"\dfrac{\pi}{2}", True),
    Case("symbolic", r"The angle is $\frac{\pi}{3}$.", r"\dfrac{\pi}{2}", False),
    Case("symbolic", r"The side is $18\sqrt{2}$.", "18", False),
)
