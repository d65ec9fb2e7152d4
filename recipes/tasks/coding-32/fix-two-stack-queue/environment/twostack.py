"""A first-in-first-out queue built from two stacks (Python lists)."""


class Queue:
    def __init__(self):
        self._inbox = []
        self._outbox = []

    def enqueue(self, item):
        """Add `item` at the back."""
        self._inbox.append(item)

    def dequeue(self):
        """Remove and return the oldest item; IndexError("queue is empty") when there is none."""
        while self._inbox:
            self._outbox.append(self._inbox.pop())
        return self._outbox.pop()

    def peek(self):
        """The oldest item, without removing it; IndexError("queue is empty") when there is none."""
        if self._outbox:
            return self._outbox[-1]
        return self._inbox[0]

    def __len__(self):
        """The number of items in the queue."""
        return len(self._inbox)

    def is_empty(self):
        """True when the queue holds no item."""
        return len(self) == 0
