"""A tool plug-in for jaxrl-llm: the worked example of docs/agents.md.

The model writes <calc>6 * 7</calc>; generation stops at "</calc>"; the tool answers
<result>42</result>, which is appended to the response (masked out of the loss), and the
model goes on. Arithmetic only, evaluated from the syntax tree: no code runs.
"""

import ast
import dataclasses
import operator

OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.Pow: operator.pow,
    ast.USub: operator.neg,
}


def evaluate(node):
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in OPS:
        if isinstance(node.op, ast.Pow) and abs(evaluate(node.right)) > 64:
            raise ValueError("exponent too large")
        return OPS[type(node.op)](evaluate(node.left), evaluate(node.right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in OPS:
        return OPS[type(node.op)](evaluate(node.operand))
    raise ValueError("only numbers and + - * / ** are allowed")


@dataclasses.dataclass
class Calculator:
    """The tool contract (jaxrl_llm/tools/protocol.py): `name`, `stop_strings`, and a call
    `tool(text) -> str | None`, where `text` is the response so far, ending in the stop
    string generation stopped at; None means "no call: the sample ends"."""

    name: str = "calculator"
    stop_strings: tuple[str, ...] = ("</calc>",)

    def __call__(self, text):
        start = text.rfind("<calc>")
        if not text.endswith("</calc>") or start < 0:
            return None
        expression = text[start + len("<calc>") : -len("</calc>")]
        try:
            value = evaluate(ast.parse(expression.strip(), mode="eval").body)
        except (SyntaxError, ValueError, ZeroDivisionError, OverflowError) as e:
            return f"\n<result>error: {e}</result>\n"
        return f"\n<result>{value:g}</result>\n"


def make_calculator():
    """The factory named in the config: RolloutConfig.tool = "example_tool:make_calculator"."""
    return Calculator()
