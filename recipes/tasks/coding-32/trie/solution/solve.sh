#!/bin/bash
# Oracle of rl360/trie: writes the reference module.
set -e
mkdir -p /app
cat > /app/trie.py <<'PY'
"""A prefix tree."""


class _Node:
    __slots__ = ("children", "end")

    def __init__(self):
        self.children: dict[str, _Node] = {}
        self.end = False


class Trie:
    def __init__(self):
        self._root = _Node()
        self._count = 0

    def insert(self, word: str) -> None:
        node = self._root
        for ch in word:
            node = node.children.setdefault(ch, _Node())
        if not node.end:
            node.end = True
            self._count += 1

    def _find(self, prefix: str):
        node = self._root
        for ch in prefix:
            node = node.children.get(ch)
            if node is None:
                return None
        return node

    def __contains__(self, word: str) -> bool:
        node = self._find(word)
        return node is not None and node.end

    def starts_with(self, prefix: str) -> list[str]:
        node = self._find(prefix)
        out: list[str] = []
        stack = [(node, prefix)] if node else []
        while stack:
            node, text = stack.pop()
            if node.end:
                out.append(text)
            stack.extend((child, text + ch) for ch, child in node.children.items())
        return sorted(out)

    def remove(self, word: str) -> bool:
        path = [self._root]
        for ch in word:
            nxt = path[-1].children.get(ch)
            if nxt is None:
                return False
            path.append(nxt)
        if not path[-1].end:
            return False
        path[-1].end = False
        self._count -= 1
        for ch, parent, child in zip(reversed(word), reversed(path[:-1]), reversed(path[1:])):
            if child.end or child.children:
                break
            del parent.children[ch]
        return True

    def __len__(self) -> int:
        return self._count
PY
