"""Channel ids: every position of every tensor dimension the graph touches, and which must go together.

The dependency graph labels each dimension of each tensor with an array of
ids, one per position. Two positions with the same id (after :meth:`Ids.find`)
must be removed together or kept together: the union-find below records every
coupling an operation implies. An id can be *pinned* (a model input or output,
an ignored module, an operation the graph cannot follow), with the reason
kept so that a refusal can name it. Each coupling is recorded with the
operation that made it (:attr:`Ids.coupling`), so that a refusal can also say
which operations tie two layers' channels together (:meth:`Ids.path`).
"""

from __future__ import annotations

import torch

IdArray = torch.Tensor
"""A ``torch.int64`` tensor of ids, shaped like the dimensions it labels."""


class Ids:
    """A union-find over channel positions, with a pin (and its reason) per class."""

    def __init__(self) -> None:
        self._parent: list[int] = []
        self._pinned: dict[int, str] = {}
        self._roots: IdArray | None = None
        """:meth:`all_roots`' answer, kept until the next change (read many times once the graph is built)."""
        self.coupling: str | None = None
        """The operation coupling ids now (set by the graph builder); ``None``: couplings are not recorded."""
        self._edges: list[tuple[IdArray, IdArray, str]] = []

    def __len__(self) -> int:
        return len(self._parent)

    def fresh(self, size: int, pin: str | None = None) -> IdArray:
        """``size`` new ids, each its own class; pinned with ``pin`` as the reason when given."""
        start = len(self._parent)
        self._roots = None
        self._parent.extend(range(start, start + size))
        if pin is not None:
            self._pinned.update(dict.fromkeys(range(start, start + size), pin))
        return torch.arange(start, start + size, dtype=torch.int64)

    def find(self, index: int) -> int:
        parent = self._parent
        root = index
        while parent[root] != root:
            root = parent[root]
        while parent[index] != root:  # path compression
            parent[index], index = root, parent[index]
        return root

    def roots(self, ids: IdArray) -> IdArray:
        """The class of every id in ``ids`` (same shape)."""
        return torch.tensor([self.find(i) for i in ids.reshape(-1).tolist()], dtype=torch.int64).reshape(ids.shape)

    def all_roots(self) -> IdArray:
        """The class of every id so far, at once (pointer jumping over a tensor: for reading, after building)."""
        if self._roots is not None:
            return self._roots
        parent = torch.tensor(self._parent, dtype=torch.int64)
        while True:
            jumped = parent[parent]
            if torch.equal(jumped, parent):
                self._roots = parent
                return parent
            parent = jumped

    def union(self, first: int, second: int) -> int:
        a, b = self.find(first), self.find(second)
        if a == b:
            return a
        if a > b:  # the older id stays the root: deterministic classes
            a, b = b, a
        self._roots = None
        self._parent[b] = a
        reason = self._pinned.pop(b, None)
        if reason is not None and a not in self._pinned:
            self._pinned[a] = reason
        return a

    def union_arrays(self, first: IdArray, second: IdArray) -> None:
        """Couple ``first[i]`` with ``second[i]`` for every ``i`` (same shape).

        :meth:`union` inlined (with path halving): it runs once per channel position of every coupling.
        """
        parent, pinned = self._parent, self._pinned
        if self.coupling is not None:
            self._edges.append((first, second, self.coupling))
        for a, b in zip(first.reshape(-1).tolist(), second.reshape(-1).tolist(), strict=True):
            while parent[a] != a:
                parent[a] = a = parent[parent[a]]
            while parent[b] != b:
                parent[b] = b = parent[parent[b]]
            if a == b:
                continue
            if a > b:  # the older id stays the root, as in union
                a, b = b, a
            self._roots = None
            parent[b] = a
            reason = pinned.pop(b, None)
            if reason is not None and a not in pinned:
                pinned[a] = reason

    def union_all(self, ids: IdArray) -> int:
        """Couple all of ``ids`` into one class; its root."""
        flat = ids.reshape(-1)
        if flat.numel() > 1:
            self.union_arrays(flat[:1].expand(flat.numel() - 1), flat[1:])
        return self.find(int(flat[0]))

    def path(self, start: IdArray, goal: IdArray) -> list[str]:
        """The operations (as :attr:`coupling` named them) on a shortest chain of couplings from ``start`` to ``goal``.

        Read only to explain a refusal: the couplings of the one class involved
        are searched breadth first. ``[]`` when none links them (or none was recorded).
        """
        if not self._edges or not start.numel() or not goal.numel():
            return []
        roots = self.all_roots()
        root = int(roots[int(start.reshape(-1)[0])])
        neighbours: dict[int, list[tuple[int, str]]] = {}
        for first, second, coupling in self._edges:
            a, b = first.reshape(-1), second.reshape(-1)
            inside = (roots[a] == root).nonzero().flatten()
            for x, y in zip(a[inside].tolist(), b[inside].tolist(), strict=True):
                neighbours.setdefault(x, []).append((y, coupling))
                neighbours.setdefault(y, []).append((x, coupling))
        targets = set(goal.reshape(-1).tolist())
        came: dict[int, tuple[int, str] | None] = dict.fromkeys(start.reshape(-1).tolist())
        frontier = list(came)
        while frontier:
            following: list[int] = []
            for x in frontier:
                if x in targets:
                    return self._walk_back(came, x)
                for y, coupling in neighbours.get(x, []):
                    if y not in came:
                        came[y] = (x, coupling)
                        following.append(y)
            frontier = following
        return []

    @staticmethod
    def _walk_back(came: dict[int, tuple[int, str] | None], end: int) -> list[str]:
        couplings: list[str] = []
        step = came[end]
        while step is not None:
            couplings.append(step[1])
            step = came[step[0]]
        return couplings[::-1]

    def pin(self, ids: IdArray, reason: str) -> None:
        """Keep every class in ``ids`` whole; the first reason given for a class is the one kept."""
        for index in ids.reshape(-1).tolist():
            self._pinned.setdefault(self.find(index), reason)

    def pin_reason(self, index: int) -> str | None:
        return self._pinned.get(self.find(index))

    def all_pinned(self, ids: IdArray) -> bool:
        return all(self.find(i) in self._pinned for i in ids.reshape(-1).tolist())
