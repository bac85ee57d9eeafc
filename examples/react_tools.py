"""A ReAct-style tool loop: the model thinks (`gen` up to the line's end), picks a tool with
`select`, gives the tool's input (constrained by `select` or `regex`; the answer by a `gen` with a
stop string), and the program runs the tool and feeds the observation back, until the model
picks `finish` (SmolLM2-135M rarely does: it is small).

    python examples/react_tools.py [http://127.0.0.1:30000]
"""

import ast
import operator

from _backend import run_example

import radixlm as sgl

FACTS = {
    "Eiffel Tower": "The Eiffel Tower is 330 metres tall.",
    "Mount Everest": "Mount Everest is 8849 metres high.",
    "Nile": "The Nile is 6650 km long.",
}
_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.USub: operator.neg,
}


def calculate(expression: str) -> str:
    """Arithmetic only (no eval of arbitrary code)."""

    def ev(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.operand))
        raise ValueError("not arithmetic")

    try:
        return str(ev(ast.parse(expression.strip(), mode="eval").body))
    except (SyntaxError, ValueError, ZeroDivisionError) as e:
        return f"error: {e}"


def lookup(topic: str) -> str:
    return FACTS.get(topic.strip(), "no result")


TOOLS = {"calculate": calculate, "lookup": lookup}
ACTIONS = [" lookup", " calculate", " finish"]
INSTRUCTIONS = """Answer the question. Tools: lookup finds a fact about a topic, calculate does arithmetic, finish gives the answer.

Question: How tall is the Eiffel Tower in centimetres?
Thought: I need the height of the Eiffel Tower.
Action: lookup
Input: Eiffel Tower.
Observation: The Eiffel Tower is 330 metres tall.
Thought: Now I convert metres to centimetres.
Action: calculate
Input: 330 * 100.
Observation: 33000
Thought: I have the answer.
Action: finish
Input: 33000 cm.

"""


@sgl.function
def react(s, question, max_steps=4):
    s += INSTRUCTIONS + "Question: " + question + "\n"
    for step in range(max_steps):
        s += "Thought:" + sgl.gen(f"thought_{step}", max_tokens=32, stop="\n") + "\n"
        # "finish" is likely after any "Action:"; normalizing by each choice's likelihood without
        # the context picks the tool the context argues for.
        s += "Action:" + sgl.select(
            f"action_{step}", choices=ACTIONS, choices_method="unconditional_likelihood_normalized"
        )
        action = s[f"action_{step}"].strip()
        # Tool inputs are constrained: a known topic (select; the space before it is healed into
        # the choice's first token), an arithmetic expression (regex), free text for the answer.
        if action == "lookup":
            s += "\nInput: " + sgl.select(f"input_{step}", choices=list(FACTS))
        elif action == "calculate":
            s += "\nInput: " + sgl.gen(
                f"input_{step}", max_tokens=16, regex=r"[0-9][0-9 +*/.-]*[0-9]"
            )
        else:
            s += "\nInput:" + sgl.gen(f"input_{step}", max_tokens=24, stop=".\n")
        s += ".\n"
        arg = s[f"input_{step}"]
        if action == "finish":
            return arg
        observation = TOOLS[action](arg)
        s.set_var(f"observation_{step}", observation)
        s += "Observation: " + observation + "\n"
    return None


def main(backend):
    s = react.run("How long is the Nile in metres?", backend=backend, temperature=0)
    print(s.text()[len(INSTRUCTIONS) :])
    print("answer:", s.ret_value)
    return s


if __name__ == "__main__":
    run_example(main)
