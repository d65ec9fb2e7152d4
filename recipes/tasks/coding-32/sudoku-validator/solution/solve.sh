#!/bin/bash
# Oracle of rl360/sudoku-validator: writes the reference module.
set -e
mkdir -p /app
cat > /app/sudoku.py <<'PY'
"""Sudoku grid checks."""


def _cells_ok(board) -> bool:
    if not isinstance(board, list) or len(board) != 9:
        return False
    for row in board:
        if not isinstance(row, list) or len(row) != 9:
            return False
        for value in row:
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 9:
                return False
    return True


def _no_repeats(values) -> bool:
    digits = [v for v in values if v]
    return len(digits) == len(set(digits))


def is_valid(board) -> bool:
    if not _cells_ok(board):
        return False
    rows = board
    cols = [[board[r][c] for r in range(9)] for c in range(9)]
    boxes = [[board[r][c] for r in range(br, br + 3) for c in range(bc, bc + 3)]
             for br in (0, 3, 6) for bc in (0, 3, 6)]
    return all(_no_repeats(group) for group in rows + cols + boxes)


def is_solved(board) -> bool:
    return is_valid(board) and all(all(row) for row in board)
PY
