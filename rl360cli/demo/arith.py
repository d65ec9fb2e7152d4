"""The arithmetic task family: small functions of x described in words, and their verifier.

A *program* is 1-3 steps applied to x in order (add, subtract, multiply, integer-divide,
remainder, square, negate, with small constants). From a program this module
makes everything both sides of the local recipe need, so they cannot drift apart:
- `instruction(program)`: the task's instruction.md (what the policy reads);
- `expression(program)`: the canonical answer, a Python expression in x written left to right;
- `action(expr)` / `SUBMIT`: the agent's two replies (a fenced bash block that writes answer.py,
  then a turn without a block), in the format of `rl360cli.agent.conversation`;
- `cases(program)`: the verifier's (input, output) pairs, and `check_answer(src, cases)`, the
  verifier itself. `recipes/tasks/generate_arith.py` writes `check_answer`'s own source into each
  task's tests/test.sh, so the in-process check (warm-up, tuning, tests) and the real verifier
  in the sandbox are the same code.

Standard library only: test.sh runs it under `python3 -I -S`.

    python -c "from rl360cli.demo.arith import *; import random; p = random_program(random.Random(0)); print(instruction(p), expression(p))"
"""

from __future__ import annotations

import random
from collections.abc import Sequence

# (op, constant); the constant is 0 for ops that take none.
Step = tuple[str, int]
Program = tuple[Step, ...]

# How each op reads in the instruction.
PHRASES = {
    "add": "add {c}",
    "sub": "subtract {c}",
    "mul": "multiply by {c}",
    "div": "divide by {c} rounding down",
    "mod": "take the remainder modulo {c}",
    "square": "square it",
    "neg": "negate it",
}
OPS = tuple(PHRASES)
# Constants each op draws from: small, so answers stay short and values stay small.
CONSTANTS = {"add": range(1, 10), "sub": range(1, 10), "mul": range(2, 10),
             "div": range(2, 10), "mod": range(2, 10), "square": range(0, 1), "neg": range(0, 1)}  # fmt: skip

# The verifier's inputs: negative, zero and positive, so that // and % on negatives count.
INPUTS = (-9, -4, -1, 0, 1, 2, 5, 7, 12, 25)

ANSWER_FILE = "answer.py"
SUBMIT = "done"
TASK_PREFIX = "Compute a function of x: start from x, "
TASK_SUFFIX = (
    ".\nWrite it as one Python expression in x to answer.py with a ```bash block "
    "(like: echo 'x*2-5' > answer.py), then reply done.\n"
)

# How each step is written after the expression it applies to.
_SUFFIX = {"add": "+{c}", "sub": "-{c}", "mul": "*{c}", "div": "//{c}", "mod": "%{c}", "square": "**2", "neg": "*-1"}


def apply_step(step: Step, v: int) -> int:
    op, c = step
    if op == "add":
        return v + c
    if op == "sub":
        return v - c
    if op == "mul":
        return v * c
    if op == "div":
        return v // c
    if op == "mod":
        return v % c
    if op == "square":
        return v * v
    if op == "neg":
        return -v
    raise ValueError(f"unknown op {op!r}; use one of {', '.join(OPS)}")


def evaluate(program: Program, x: int) -> int:
    v = x
    for step in program:
        v = apply_step(step, v)
    return v


def cases(program: Program) -> list[tuple[int, int]]:
    """The verifier's (input, expected output) pairs."""
    return [(x, evaluate(program, x)) for x in INPUTS]


def describe(program: Program) -> str:
    return ", then ".join(PHRASES[op].format(c=c) for op, c in program)


def instruction(program: Program) -> str:
    """The instruction.md text of a program (ends with one newline)."""
    return TASK_PREFIX + describe(program) + TASK_SUFFIX


def expression(program: Program) -> str:
    """The canonical answer: a Python expression in x that applies the steps left to right.

    Every step after the first closes a bracket opened at the start, so the text never depends
    on operator precedence: one `(` per step after the first, `x`, then each step's operator
    and constant in the order the instruction names them (negation is `*-1`):
    "add 4, mul 4, sub 9" -> `((x+4)*4)-9`.
    """
    parts = ["(" * (len(program) - 1), "x"]
    for index, (op, c) in enumerate(program):
        if index:
            parts.append(")")
        parts.append(_SUFFIX[op].format(c=c))
    return "".join(parts)


def action(expr: str) -> str:
    """The agent turn that writes `expr` to the answer file."""
    return f"```bash\necho '{expr}' > {ANSWER_FILE}\n```"


def random_program(rng: random.Random, num_ops: int | None = None) -> Program:
    """A program of `num_ops` steps (1-3 at random when None) that is not constant on INPUTS."""
    while True:
        n = num_ops if num_ops is not None else rng.randint(1, 3)
        steps: list[Step] = []
        while len(steps) < n:
            op = rng.choice(OPS)
            # Negating twice, or squaring twice (values grow to x**4), teaches nothing.
            if steps and steps[-1][0] == op and op in ("neg", "square"):
                continue
            steps.append((op, rng.choice(CONSTANTS[op])))
        program = tuple(steps)
        if len({y for _, y in cases(program)}) > 1:
            return program


def parse_program(text: str) -> Program:
    """`"mul 3, add 1"` -> (("mul", 3), ("add", 1)); the inverse of `program_text`."""
    steps = []
    for part in text.split(","):
        words = part.split()
        if not words or words[0] not in PHRASES or len(words) > 2:
            raise ValueError(f"bad step {part.strip()!r}; write e.g. 'mul 3, add 1' with ops {', '.join(OPS)}")
        steps.append((words[0], int(words[1]) if len(words) == 2 else 0))
    return tuple(steps)


def program_text(program: Program) -> str:
    return ", ".join(f"{op} {c}" if CONSTANTS[op] != range(0, 1) else op for op, c in program)


def check_answer(src: str, cases: Sequence[Sequence[int]]) -> bool:
    """Whether `src` is one Python expression in x that gives every case's output.

    The expression is parsed as an expression (so `x+1; junk` is refused), and only integer
    constants, x, brackets and + - * / // % ** (with a constant exponent of at most 8) are
    allowed: nothing can call, import or run for long. Standard library only; test.sh holds a
    copy of this function's source. It reads the tree through `_ast` (built into the interpreter),
    not `ast`, whose import costs the verifier's interpreter more than the whole check (~5 ms of
    ~12 ms, paid by every attempt).
    """
    import _ast

    src = src.strip()
    if not src or len(src) > 500:
        return False
    try:
        tree = compile(src, "answer", "eval", _ast.PyCF_ONLY_AST)
        code = compile(tree, "answer", "eval")
    except (SyntaxError, ValueError):
        return False
    binops = (_ast.Add, _ast.Sub, _ast.Mult, _ast.Div, _ast.FloorDiv, _ast.Mod, _ast.Pow)
    nodes = [tree]
    while nodes:
        node = nodes.pop()
        if isinstance(node, _ast.BinOp):
            if not isinstance(node.op, binops):
                return False
            if isinstance(node.op, _ast.Pow):
                e = node.right
                if not (isinstance(e, _ast.Constant) and type(e.value) is int and 0 <= e.value <= 8):
                    return False
        elif isinstance(node, _ast.UnaryOp):
            if not isinstance(node.op, (_ast.USub, _ast.UAdd)):
                return False
        elif isinstance(node, _ast.Name):
            if node.id != "x":
                return False
        elif isinstance(node, _ast.Constant):
            if type(node.value) is not int:
                return False
        elif not isinstance(node, (_ast.Expression, _ast.Load, *binops, _ast.USub, _ast.UAdd)):
            return False
        # Every child node, as ast.walk finds them (the fields that hold a node or a list of nodes).
        for name in node._fields:
            value = getattr(node, name, None)
            if isinstance(value, _ast.AST):
                nodes.append(value)
            elif isinstance(value, list):
                nodes.extend(item for item in value if isinstance(item, _ast.AST))
    for x, expected in cases:
        try:
            value = eval(code, {"__builtins__": {}}, {"x": x})
        except (ArithmeticError, ValueError):
            return False
        if type(value) not in (int, float) or value != expected:
            return False
    return True
