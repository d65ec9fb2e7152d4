import copy
import sys

sys.path.insert(0, "/app")

from sudoku import is_solved, is_valid  # noqa: E402


SOLVED = [
    [5, 3, 4, 6, 7, 8, 9, 1, 2],
    [6, 7, 2, 1, 9, 5, 3, 4, 8],
    [1, 9, 8, 3, 4, 2, 5, 6, 7],
    [8, 5, 9, 7, 6, 1, 4, 2, 3],
    [4, 2, 6, 8, 5, 3, 7, 9, 1],
    [7, 1, 3, 9, 2, 4, 8, 5, 6],
    [9, 6, 1, 5, 3, 7, 2, 8, 4],
    [2, 8, 7, 4, 1, 9, 6, 3, 5],
    [3, 4, 5, 2, 8, 6, 1, 7, 9],
]


def _with(changes):
    board = copy.deepcopy(SOLVED)
    for (r, c), value in changes.items():
        board[r][c] = value
    return board


def test_solved_board():
    assert is_valid(SOLVED)
    assert is_solved(SOLVED)


def test_partial_board():
    board = _with({(0, 0): 0, (4, 4): 0, (8, 8): 0})
    assert is_valid(board)
    assert not is_solved(board)
    assert is_valid([[0] * 9 for _ in range(9)])


def test_row_repeat():
    board = [[0] * 9 for _ in range(9)]
    board[2][0] = board[2][8] = 7
    assert not is_valid(board)


def test_column_repeat():
    board = [[0] * 9 for _ in range(9)]
    board[0][4] = board[8][4] = 3
    assert not is_valid(board)


def test_box_only_repeat():
    board = [[0] * 9 for _ in range(9)]
    board[3][3] = board[5][5] = 9
    assert not is_valid(board)


def test_bad_shape():
    assert not is_valid(SOLVED[:8])
    assert not is_valid([row + [1] for row in SOLVED])
    assert not is_valid([])
    assert not is_valid(None)


def test_bad_values():
    assert not is_valid(_with({(0, 0): 10}))
    assert not is_valid(_with({(0, 0): -1}))
    assert not is_valid(_with({(0, 0): "5"}))
    assert not is_valid(_with({(0, 0): 5.0}))
