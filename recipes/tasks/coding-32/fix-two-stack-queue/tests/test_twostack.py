import collections
import random
import sys

import pytest

sys.path.insert(0, "/app")

from twostack import Queue  # noqa: E402


def test_fifo():
    q = Queue()
    for i in range(5):
        q.enqueue(i)
    assert [q.dequeue() for _ in range(5)] == [0, 1, 2, 3, 4]


def test_interleaved():
    q = Queue()
    q.enqueue(1)
    q.enqueue(2)
    assert q.dequeue() == 1
    q.enqueue(3)
    assert q.dequeue() == 2
    assert q.dequeue() == 3


def test_len_and_is_empty():
    q = Queue()
    assert len(q) == 0 and q.is_empty()
    q.enqueue("a")
    q.enqueue("b")
    q.dequeue()
    assert len(q) == 1 and not q.is_empty()
    q.dequeue()
    assert len(q) == 0 and q.is_empty()


def test_peek():
    q = Queue()
    q.enqueue(1)
    q.enqueue(2)
    q.dequeue()
    q.enqueue(3)
    assert q.peek() == 2
    assert len(q) == 2
    assert q.dequeue() == 2


def test_empty_dequeue():
    q = Queue()
    with pytest.raises(IndexError, match="queue is empty"):
        q.dequeue()
    q.enqueue(1)
    q.dequeue()
    with pytest.raises(IndexError, match="queue is empty"):
        q.dequeue()


def test_empty_peek():
    with pytest.raises(IndexError, match="queue is empty"):
        Queue().peek()


def test_random_against_deque():
    rng = random.Random(4)
    q, model = Queue(), collections.deque()
    for step in range(3000):
        if model and rng.random() < 0.45:
            assert q.dequeue() == model.popleft()
        else:
            q.enqueue(step)
            model.append(step)
        assert len(q) == len(model)
