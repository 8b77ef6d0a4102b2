"""Regular expressions from files (plan rules, compressed-tensors targets) matched in linear time.

Python's ``re`` backtracks: ``(.*.*)*z`` against a 30-character name never finishes. A pattern
read from a user's or a downloaded file is therefore parsed here into a checked subset of the
syntax and matched by a Thompson automaton, simulated as a lazily built DFA (the technique of
RE2): each character of a name costs one dictionary look-up once its DFA state is known, and at
most :data:`MAX_STATES` NFA states when it is not, whatever the pattern.

The subset (what tensor-name patterns use): literals and escaped punctuation; ``.``; classes
``[a-z_0-9]``, ``[^.]``; ``\\d \\D \\w \\W \\s \\S``; groups ``(...)``, ``(?:...)``,
``(?P<name>...)``; ``|``; ``* + ? {m} {m,} {m,n} {,n}`` (lazy forms too: they do not change
whether a name matches); anchors ``^ $ \\A \\Z``. Refused with a :class:`LowbitError` naming
the construct: back-references, look-arounds, conditionals, inline flags, ``\\b``, patterns
longer than :data:`MAX_PATTERN` characters or that expand past :data:`MAX_STATES` states.
On this subset a match means what ``re.match``/``re.fullmatch`` mean (property-tested against
``re`` in ``tests/test_regex.py``).
"""

from __future__ import annotations

import fnmatch
import functools
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from lowbit.errors import LowbitError

__all__ = [
    "MAX_PATTERN",
    "MAX_PLAN_REGEX_CHARS",
    "MAX_STATES",
    "BoundedRegex",
    "BoundedSearch",
    "Glob",
    "check_plan_patterns",
    "compile_bounded",
    "compile_search",
]

#: The longest pattern read from a file (tensor-name patterns are tens of characters).
MAX_PATTERN = 1000
#: The most automaton states one pattern may expand to (``a{500}`` is 500).
MAX_STATES = 2000
#: DFA states cached per pattern before the cache starts over (bounds memory).
_MAX_DFA = 4096

_Pred = Callable[[str], bool]
_CLASSES: dict[str, _Pred] = {
    "d": str.isdecimal,
    "D": lambda c: not c.isdecimal(),
    "w": lambda c: c.isalnum() or c == "_",
    "W": lambda c: not (c.isalnum() or c == "_"),
    "s": str.isspace,
    "S": lambda c: not c.isspace(),
}
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v", "a": "\a"}


# ---- parsing to a tree ---------------------------------------------------------------
# nodes: ("char", pred) ("cat", [nodes]) ("alt", [nodes]) ("rep", node, lo, hi|None)
# ("bol",) ("eol",) ("eos",)


class _Parser:
    def __init__(self, pattern: str, where: str) -> None:
        self.p, self.i, self.where = pattern, 0, where
        self.names: set[str] = set()

    def fail(self, why: str) -> LowbitError:
        shown = self.p if len(self.p) <= 60 else self.p[:57] + "..."
        return LowbitError(
            f"{self.where} regex {shown!r} does not compile: {why} (at character {self.i})"
        )

    def peek(self) -> str | None:
        return self.p[self.i] if self.i < len(self.p) else None

    def parse(self) -> tuple:
        node = self.alt()
        if self.i != len(self.p):
            raise self.fail("unbalanced ')'")
        return node

    def alt(self) -> tuple:
        branches = [self.cat()]
        while self.peek() == "|":
            self.i += 1
            branches.append(self.cat())
        return branches[0] if len(branches) == 1 else ("alt", branches)

    def cat(self) -> tuple:
        items = []
        while (c := self.peek()) is not None and c not in "|)":
            items.append(self.repeat(self.atom()))
        return ("cat", items)

    def repeat(self, node: tuple) -> tuple:
        while (c := self.peek()) is not None and c in "*+?{":
            start = self.i
            if c == "{":
                bounds = self.braces()
                if bounds is None:  # a literal "{", as re reads it
                    self.i = start
                    return node
                lo, hi = bounds
            else:
                self.i += 1
                lo, hi = {"*": (0, None), "+": (1, None), "?": (0, 1)}[c]
            if node[0] in ("bol", "eol", "eos"):
                raise self.fail("a quantifier on an anchor")
            if node[0] == "rep":
                raise self.fail("multiple repeat")
            if self.peek() == "?":
                self.i += 1  # lazy: the same set of matching names
            elif self.peek() == "+":
                raise self.fail("possessive quantifiers are not supported")
            node = ("rep", node, lo, hi)
        return node

    def braces(self) -> tuple[int, int | None] | None:
        j = self.p.find("}", self.i)
        if j < 0:
            return None
        body = self.p[self.i + 1 : j]
        lo_s, comma, hi_s = body.partition(",")
        ok = lambda s: s == "" or (s.isascii() and s.isdigit() and len(s) <= 6)  # noqa: E731
        if not (ok(lo_s) and ok(hi_s)) or (not comma and lo_s == ""):
            return None
        lo = int(lo_s) if lo_s else 0
        hi = (int(hi_s) if hi_s else None) if comma else lo
        if hi is not None and hi < lo:
            raise self.fail("min repeat greater than max repeat")
        if max(lo, hi or 0) > MAX_STATES:
            raise self.fail(f"a repeat count over {MAX_STATES}")
        self.i = j + 1
        return lo, hi

    def atom(self) -> tuple:
        c = self.p[self.i]
        self.i += 1
        if c == ".":
            return ("char", lambda ch: ch != "\n")
        if c == "^":
            return ("bol",)
        if c == "$":
            return ("eol",)
        if c == "(":
            return self.group()
        if c == "[":
            return ("char", self.klass())
        if c == "\\":
            esc = self.escape(in_class=False)
            return esc if isinstance(esc, tuple) else ("char", esc)
        if c in "*+?":
            raise self.fail("nothing to repeat")
        if c == "{" and self.braces_at(self.i - 1):
            raise self.fail("nothing to repeat")
        return ("char", _literal(c))

    def braces_at(self, i: int) -> bool:
        save = self.i
        self.i = i
        try:
            return self.braces() is not None
        finally:
            self.i = save

    def group(self) -> tuple:
        if self.p.startswith("?:", self.i):
            self.i += 2
        elif self.p.startswith("?P<", self.i):
            j = self.p.find(">", self.i)
            name = self.p[self.i + 3 : j] if j > 0 else ""
            if not name.isidentifier():
                raise self.fail("a bad group name")
            if name in self.names:
                raise self.fail(f"the group name {name!r} is given twice")
            self.names.add(name)
            self.i = j + 1
        elif self.peek() == "?":
            raise self.fail(
                "look-arounds, back-references, conditionals and inline flags are not supported"
            )
        node = self.alt()
        if self.peek() != ")":
            raise self.fail("missing ')'")
        self.i += 1
        return node

    def escape(self, *, in_class: bool) -> _Pred | tuple:
        c = self.peek()
        if c is None:
            raise self.fail("a pattern ending in a backslash")
        self.i += 1
        if c in _CLASSES:
            return _CLASSES[c]
        if c in _ESCAPES:
            return _literal(_ESCAPES[c])
        if not in_class and c == "A":
            return ("bol",)
        if not in_class and c == "Z":
            return ("eos",)
        if c.isascii() and c.isalnum():
            raise self.fail(f"the escape \\{c} is not supported")
        return _literal(c)

    def klass(self) -> _Pred:
        negate = self.peek() == "^"
        if negate:
            self.i += 1
        parts: list[_Pred] = []
        first = True
        while True:
            c = self.peek()
            if c is None:
                raise self.fail("an unterminated character set")
            if c == "]" and not first:
                self.i += 1
                break
            first = False
            if c == "[" and self.p.startswith(("[:", "[=", "[."), self.i):
                raise self.fail("POSIX classes are not supported")
            lo = self.class_char()
            if (
                isinstance(lo, str)
                and self.peek() == "-"
                and self.p[self.i + 1 : self.i + 2] not in ("]", "")
            ):
                self.i += 1
                hi = self.class_char()
                if not isinstance(hi, str):
                    raise self.fail("a range ending in a class")
                if hi < lo:
                    raise self.fail("a bad character range")
                parts.append(lambda ch, a=lo, b=hi: a <= ch <= b)
            else:
                parts.append(_literal(lo) if isinstance(lo, str) else lo)
        return (
            (lambda ch: not any(p(ch) for p in parts))
            if negate
            else (lambda ch: any(p(ch) for p in parts))
        )

    def class_char(self) -> str | _Pred:
        c = self.p[self.i]
        self.i += 1
        if c != "\\":
            return c
        d = self.peek()
        if d is None:
            raise self.fail("a pattern ending in a backslash")
        self.i += 1
        if d in _ESCAPES:
            return _ESCAPES[d]
        if d == "b":
            return "\b"
        if d in _CLASSES:
            return _CLASSES[d]
        if d.isascii() and d.isalnum():
            raise self.fail(f"the escape \\{d} is not supported")
        return d


def _literal(c: str) -> _Pred:
    return lambda ch: ch == c


# ---- the automaton --------------------------------------------------------------------


@dataclass
class _NFA:
    kind: list[str] = field(default_factory=list)  # char, split, bol, eol, eos, match
    pred: list[_Pred | None] = field(default_factory=list)
    out: list[list[int]] = field(default_factory=list)

    def add(self, kind: str, pred: _Pred | None = None) -> int:
        if len(self.kind) >= MAX_STATES:
            raise OverflowError
        self.kind.append(kind)
        self.pred.append(pred)
        self.out.append([])
        return len(self.kind) - 1


def _build(nfa: _NFA, node: tuple, nxt: int) -> int:
    """The entry state of ``node``, whose exits go to ``nxt`` (built back to front)."""
    kind = node[0]
    if kind == "char":
        s = nfa.add("char", node[1])
        nfa.out[s] = [nxt]
        return s
    if kind in ("bol", "eol", "eos"):
        s = nfa.add(kind)
        nfa.out[s] = [nxt]
        return s
    if kind == "cat":
        for item in reversed(node[1]):
            nxt = _build(nfa, item, nxt)
        return nxt
    if kind == "alt":
        s = nfa.add("split")
        nfa.out[s] = [_build(nfa, b, nxt) for b in node[1]]
        return s
    _, body, lo, hi = node
    if hi is None:  # body{lo,}: lo copies, then a loop
        loop = nfa.add("split")
        nfa.out[loop] = [_build(nfa, body, loop), nxt]
        entry = loop
    else:
        entry = nxt
        for _ in range(hi - lo):  # optional copies
            s = nfa.add("split")
            nfa.out[s] = [_build(nfa, body, entry), nxt]
            entry = s
    for _ in range(lo):
        entry = _build(nfa, body, entry)
    return entry


class BoundedRegex:
    """A pattern of the checked subset, matched in time linear in the name's length."""

    def __init__(self, pattern: str, where: str = "regex") -> None:
        if not isinstance(pattern, str):
            raise LowbitError(f"{where} regex must be a string, got {type(pattern).__name__}")
        if len(pattern) > MAX_PATTERN:
            raise LowbitError(
                f"{where} regex of {len(pattern):,} characters; lowbit reads patterns of at "
                f"most {MAX_PATTERN}"
            )
        self.pattern = pattern
        # no re.compile() here: sre takes ~15 ms on a 500-character pattern (2,000 rules: 30 s);
        # the parser refuses what re refuses on the subset (property-tested against re)
        tree = _Parser(pattern, where).parse()
        self._nfa = _NFA()
        try:
            self._accept = self._nfa.add("match")
            self._start = _build(self._nfa, tree, self._accept)
        except OverflowError:
            raise LowbitError(
                f"{where} regex {pattern[:60]!r} expands to more than {MAX_STATES} states"
            ) from None
        self._where = where
        self._moves: dict[tuple[frozenset[int], str], frozenset[int]] = {}
        self._end: dict[frozenset[int], bool] = {}
        self._first = self._closure([self._start], at_start=True)

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        return (BoundedRegex, (self.pattern, self._where))  # rebuilt: predicates are lambdas

    def __repr__(self) -> str:
        return f"BoundedRegex({self.pattern!r})"

    def _closure(
        self,
        states: list[int] | frozenset[int],
        *,
        at_start: bool = False,
        at_eol: bool = False,
        at_eos: bool = False,
    ) -> frozenset[int]:
        """States reachable without reading a character, where the anchors that hold here
        are passed (``^`` at the start; ``$`` at the end or before a final newline; ``\\Z``
        at the end); the others stay in the set, unpassed."""
        kind, out = self._nfa.kind, self._nfa.out
        seen: set[int] = set()
        stack = list(states)
        while stack:
            s = stack.pop()
            if s in seen:
                continue
            seen.add(s)
            k = kind[s]
            if (
                k == "split"
                or (k == "bol" and at_start)
                or (k == "eol" and at_eol)
                or (k == "eos" and at_eos)
            ):
                stack.extend(out[s])
        return frozenset(seen)

    def _step(self, cur: frozenset[int], ch: str) -> frozenset[int]:
        key = (cur, ch)
        got = self._moves.get(key)
        if got is None:
            kind, pred, out = self._nfa.kind, self._nfa.pred, self._nfa.out
            nxt = [out[s][0] for s in cur if kind[s] == "char" and pred[s](ch)]  # type: ignore[misc]
            got = self._closure(nxt)
            if len(self._moves) >= _MAX_DFA:
                self._moves.clear()
            self._moves[key] = got
        return got

    def _ends_here(self, cur: frozenset[int]) -> bool:
        """Whether a name may end in DFA state ``cur`` (cached: one pass per state)."""
        got = self._end.get(cur)
        if got is None:
            got = self._accept in self._closure(cur, at_eol=True, at_eos=True)
            if len(self._end) >= _MAX_DFA:
                self._end.clear()
            self._end[cur] = got
        return got

    def _run(self, name: str, *, full: bool) -> bool:
        n = len(name)
        if n == 0:
            cur = self._closure([self._start], at_start=True, at_eol=True, at_eos=True)
            return self._accept in cur
        cur = self._first
        for i, ch in enumerate(name):
            if i == n - 1 and ch == "\n":  # "$" also holds before a final newline
                cur = self._closure(cur, at_start=i == 0, at_eol=True)
            if not full and self._accept in cur:
                return True
            cur = self._step(cur, ch)
            if not cur:
                return False
        return self._ends_here(cur)

    def match(self, name: str) -> bool:
        """Whether the name starts with a match (``re.match``)."""
        return self._run(name, full=False)

    def fullmatch(self, name: str) -> bool:
        """Whether the whole name matches (``re.fullmatch``)."""
        return self._run(name, full=True)


class Glob:
    """``fnmatch.fnmatchcase(name, glob)`` as a callable built once: globs of literals and
    ``*`` (nearly all) by ordered substring finds, linear and with no regex to compile (10,000
    rules compiled as regexes took seconds); others by ``fnmatch.translate``'s regex."""

    def __init__(self, glob: str) -> None:
        self.glob = glob
        self._rx = re.compile(fnmatch.translate(glob)) if "?" in glob or "[" in glob else None
        self._pieces = glob.split("*")

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (Glob, (self.glob,))

    def key_piece(self) -> str:
        """A literal every matching name holds: the glob's longest ``*``-separated piece ("" for
        globs with ``?`` or ``[``, whose pieces are not literal)."""
        return "" if self._rx is not None else max(self._pieces, key=len)

    def test(self, name: str) -> bool:
        """Whether ``name`` matches the glob."""
        if self._rx is not None:
            return self._rx.match(name) is not None
        pieces = self._pieces
        if len(pieces) == 1:
            return name == self.glob
        head, tail = pieces[0], pieces[-1]
        if len(name) < len(head) + len(tail) or not name.startswith(head):
            return False
        if not name.endswith(tail):
            return False
        pos, end = len(head), len(name) - len(tail)
        for k in range(1, len(pieces) - 1):  # leftmost finds decide "in order" exactly
            j = name.find(pieces[k], pos, end)
            if j < 0:
                return False
            pos = j + len(pieces[k])
        return True


def compile_bounded(pattern: str, where: str = "regex") -> BoundedRegex:
    """See :func:`_compile` (a cache: 10,000 rules of one pattern build one automaton)."""
    if not isinstance(pattern, str):
        raise LowbitError(f"{where} regex must be a string, got {type(pattern).__name__}")
    return _compile(pattern, where)


class BoundedSearch:
    """``re.search`` by a bounded pattern: a match anywhere in the name, in linear time."""

    def __init__(self, pattern: str, where: str) -> None:
        compile_bounded(pattern, where)  # the pattern alone is checked: "a)(b" stays refused
        self.pattern = pattern
        # a lazy any-character prefix: "^" keeps holding only at position 0, as in re.search
        self._rx = BoundedRegex(r"[\s\S]*?(?:" + pattern + ")", where)

    def search(self, name: str) -> bool:
        """Whether the pattern matches somewhere in ``name``."""
        return self._rx.match(name)


def compile_search(pattern: str, where: str = "regex") -> BoundedSearch:
    """A pattern from a user or a file for ``re.search``'s meaning (llama.cpp's
    ``--tensor-type``), parsed into the checked subset and matched in linear time.

    Raises:
        LowbitError: as :func:`compile_bounded`.
    """
    if not isinstance(pattern, str):
        raise LowbitError(f"{where} regex must be a string, got {type(pattern).__name__}")
    return BoundedSearch(pattern, where)


@functools.lru_cache(maxsize=1024)
def _compile(pattern: str, where: str) -> BoundedRegex:
    """Parse a pattern from a file into a linear-time matcher.

    Args:
        pattern: the regular expression (the checked subset of the module docstring).
        where: the file and field it came from, for the message.

    Raises:
        LowbitError: a construct outside the subset, a pattern over :data:`MAX_PATTERN`
            characters or :data:`MAX_STATES` states, or one ``re`` would not compile.
    """
    return BoundedRegex(pattern, where)


#: The most regex characters one plan may hold: each is matched against every tensor name, so
#: their total bounds the plan's cost (2,000 rules of 500 characters took 33 s on 50 names).
MAX_PLAN_REGEX_CHARS = 20_000


def check_plan_patterns(rules: list[Any], where: str) -> None:
    """Refuse plan-file rules (raw dicts) whose ``regex`` and ``re:`` patterns total more than
    :data:`MAX_PLAN_REGEX_CHARS` characters, before any is compiled."""
    total = 0
    for r in rules:
        if not isinstance(r, dict):
            continue
        for key in ("regex", "match"):
            v = r.get(key)
            for x in v if isinstance(v, list) else [v]:
                if isinstance(x, str) and (key == "regex" or x.startswith("re:")):
                    total += len(x)
    if total > MAX_PLAN_REGEX_CHARS:
        raise LowbitError(
            f"{where}: the rules' regexes hold {total:,} characters; a plan may hold "
            f"{MAX_PLAN_REGEX_CHARS:,} (each is matched against every tensor name)"
        )
