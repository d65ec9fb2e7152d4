"""The two kinds of error the CLI turns into exit codes.

`Rl360Error` is bad input or a failed precondition: it prints as one line that
names the problem and the fix, and exits 1. `RunFailed` is a run or component
that failed: exit 3.
"""


class Rl360Error(Exception):
    """Bad input or a failed precondition (exit 1)."""

    exit_code = 1

    def __init__(self, problem: str, fix: str | None = None):
        self.problem = problem
        self.fix = fix
        super().__init__(f"{problem}; {fix}" if fix else problem)


class RunFailed(Rl360Error):
    """A run or one of its components failed (exit 3)."""

    exit_code = 3
