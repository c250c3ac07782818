"""Symbolic dimensions: the sizes a graph leaves open until a batch arrives (`n_tokens`, `n_kv`, ...).

A dimension is a plain ``int`` when it is fixed by the model, or a :class:`Sym` when a ubatch or the cache
decides it. ``Sym`` is a small polynomial with integer coefficients (enough for reshapes such as
``64*n_tokens``), kept in one canonical form so that equal sizes compare, hash and print identically.
Symbols are always printed by the name the user knows, never by a generated id.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

# A monomial is a sorted tuple of symbol names (with repeats for powers); () is the constant term.
_Terms = tuple[tuple[tuple[str, ...], int], ...]


class Sym:
    """A symbolic size: sum of coefficient * product-of-symbols, canonically ordered."""

    __slots__ = ("terms", "_hash", "_text")

    def __init__(self, terms: _Terms):
        self.terms = terms
        self._hash = hash(terms)
        self._text: str | None = None  # its spelling, made on first use: a graph's text prints each shape often

    @staticmethod
    def named(name: str) -> Sym:
        return Sym((((name,), 1),))

    @staticmethod
    def make(acc: dict[tuple[str, ...], int]) -> Dim:
        terms = tuple(sorted((m, c) for m, c in acc.items() if c != 0))
        if not terms:
            return 0
        if len(terms) == 1 and terms[0][0] == ():
            return terms[0][1]
        return Sym(terms)

    def _acc(self) -> dict[tuple[str, ...], int]:
        return dict(self.terms)

    def __add__(self, other: Dim) -> Dim:
        acc = self._acc()
        for m, c in _terms(other):
            acc[m] = acc.get(m, 0) + c
        return Sym.make(acc)

    __radd__ = __add__

    def __sub__(self, other: Dim) -> Dim:
        return self + (-1) * other

    def __mul__(self, other: Dim) -> Dim:
        acc: dict[tuple[str, ...], int] = {}
        for m1, c1 in self.terms:
            for m2, c2 in _terms(other):
                m = tuple(sorted(m1 + m2))
                acc[m] = acc.get(m, 0) + c1 * c2
        return Sym.make(acc)

    __rmul__ = __mul__

    def __floordiv__(self, k: int) -> Dim:
        if not isinstance(k, int) or k == 0 or any(c % k for _, c in self.terms):
            raise ValueError(f"{self} is not divisible by {k}")
        return Sym.make({m: c // k for m, c in self.terms})

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sym) and self.terms == other.terms

    def __hash__(self) -> int:
        return self._hash

    @property
    def symbols(self) -> frozenset[str]:
        return frozenset(s for m, _ in self.terms for s in m)

    def eval(self, env: dict[str, int]) -> int:
        total = 0
        for m, c in self.terms:
            v = c
            for s in m:
                v *= env[s]
            total += v
        return total

    def __str__(self) -> str:
        if self._text is None:
            self._text = self._spell()
        return self._text

    def _spell(self) -> str:
        parts = []
        for m, c in reversed(self.terms):  # highest-degree terms first, constant last
            prod = "*".join(m)
            if not m:
                parts.append(str(c))
            elif c == 1:
                parts.append(prod)
            else:
                parts.append(f"{c}*{prod}")
        return "+".join(parts).replace("+-", "-")

    __repr__ = __str__


Dim = Union[int, Sym]


def _terms(d: Dim) -> _Terms:
    return d.terms if isinstance(d, Sym) else (((), d),)


def parse_dim(text: str) -> Dim:
    """Inverse of ``str(dim)``: ``'576'``, ``'n_kv'``, ``'64*n_tokens'``, ``'n_tokens+1'``."""
    acc: dict[tuple[str, ...], int] = {}
    for term in text.replace("-", "+-").split("+"):
        if not term:
            continue
        coeff, names = 1, []
        for factor in term.split("*"):
            neg = factor.startswith("-")
            factor = factor.lstrip("-")
            if neg:
                coeff = -coeff
            if factor.isdigit():
                coeff *= int(factor)
            elif factor.isidentifier():
                names.append(factor)
            else:
                raise ValueError(f"bad dimension {text!r}")
        m = tuple(sorted(names))
        acc[m] = acc.get(m, 0) + coeff
    return Sym.make(acc)


def numel(shape: tuple[Dim, ...]) -> Dim:
    n: Dim = 1
    for d in shape:
        n = n * d
    return n


def divides(a: Dim, b: Dim) -> bool:
    """True when ``b`` is known to be a whole multiple of ``a`` for every binding (ggml broadcast rule)."""
    if a == 1 or a == b:
        return True
    if isinstance(a, int) and isinstance(b, int):
        return a != 0 and b % a == 0
    if isinstance(a, int) and isinstance(b, Sym):
        return all(c % a == 0 for _, c in b.terms)
    return False


@dataclass(frozen=True)
class DimDecl:
    """A symbolic dimension the graph leaves open, with the range a ubatch or cache may bind it to."""

    name: str
    min: Dim = 1
    max: Dim | None = None  # None: unbounded
    doc: str = field(default="", compare=False)

    @property
    def sym(self) -> Sym:
        return Sym.named(self.name)

    def __str__(self) -> str:
        hi = "inf" if self.max is None else str(self.max)
        return f"{self.name} in [{self.min}, {hi}]"
