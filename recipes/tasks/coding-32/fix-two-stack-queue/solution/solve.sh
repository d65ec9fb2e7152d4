#!/bin/bash
# Oracle of rl360/fix-two-stack-queue: writes the reference module.
set -e
mkdir -p /app
cat > /app/twostack.py <<'PY'
"""A first-in-first-out queue built from two stacks (Python lists)."""


class Queue:
    def __init__(self):
        self._inbox = []
        self._outbox = []

    def enqueue(self, item):
        """Add `item` at the back."""
        self._inbox.append(item)

    def _refill(self):
        # Only when the outbox is empty: its items are older than everything in the inbox.
        if not self._outbox:
            while self._inbox:
                self._outbox.append(self._inbox.pop())
        if not self._outbox:
            raise IndexError("queue is empty")

    def dequeue(self):
        """Remove and return the oldest item; IndexError("queue is empty") when there is none."""
        self._refill()
        return self._outbox.pop()

    def peek(self):
        """The oldest item, without removing it; IndexError("queue is empty") when there is none."""
        self._refill()
        return self._outbox[-1]

    def __len__(self):
        """The number of items in the queue."""
        return len(self._inbox) + len(self._outbox)

    def is_empty(self):
        """True when the queue holds no item."""
        return len(self) == 0
PY
