"""What a JSON text costs once parsed into Python objects: how many values it holds.

Parsed, each JSON value becomes a Python object (a dict, a list, a number, a string): about
50-60 bytes apiece whatever the text spelled, so ``[{},{},...]`` costs some 20x its text. A
string costs its characters, once; blanks cost nothing. So a document's parsing memory is
bounded by its bytes *and* the count of its values, which :func:`values_at_most` tells without
parsing: every ``,`` ``:`` ``[`` ``{`` outside strings begins or separates one, every string is
one. It reads the text in windows of :data:`WINDOW` bytes with numpy (an escaped quote is one
after an odd run of backslashes), so its own memory is a few windows whatever the text.
"""

from __future__ import annotations

import numpy as np

__all__ = ["WINDOW", "values_at_most"]

#: Bytes read per step (the step's index arrays take at most 8x this).
WINDOW = 1 << 20
_QUOTE, _BACKSLASH = ord('"'), ord("\\")
_OPENERS = (b",", b":", b"[", b"{")
_IS_OPENER = np.zeros(256, bool)
_IS_OPENER[[ord(c) for c in _OPENERS]] = True
_SPECIAL = b"".join(_OPENERS) + b'"'


def values_at_most(text: bytes | bytearray, start: int, end: int, limit: int) -> bool:
    """Whether the JSON ``text[start:end]`` holds at most ``limit`` values (see the module
    docstring); for text that is not JSON, a count no parser relies on (it refuses that text).

    Raises:
        nothing.
    """
    # A bound first, in one pass at C speed: brackets and commas inside strings count here too
    # (and each quote as a value), so the windows are read only when it is past the limit.
    bound = 0
    for w in range(start, end, 4 * WINDOW):
        piece = text[w : min(w + 4 * WINDOW, end)]
        bound += len(piece) - len(piece.translate(None, _SPECIAL))
    if bound <= limit:
        return True
    return _count(np.frombuffer(text, np.uint8, end - start, start), limit) <= limit


def _count(text: np.ndarray, limit: int) -> int:
    """Values in ``text`` (uint8), exactly, or a count past ``limit`` once one is."""
    openers = quotes = 0
    inside = False  # whether the window starts inside a string
    run = 0  # the backslashes that end the text before the window
    for w in range(0, text.size, WINDOW):
        win = text[w : w + WINDOW]
        real = np.flatnonzero(win == _QUOTE)
        if real.size:
            real = _unescaped(win, real, run)
        at = np.flatnonzero(_IS_OPENER[win])
        if real.size:  # an opener is outside strings after an even count of quotes
            openers += int(np.count_nonzero((np.searchsorted(real, at) + inside) % 2 == 0))
        elif not inside:
            openers += at.size
        quotes += real.size
        inside ^= bool(real.size % 2)
        run = _trailing_backslashes(win, run)
        if openers + quotes // 2 > limit:
            break
    return openers + quotes // 2


def _unescaped(win: np.ndarray, quotes: np.ndarray, run: int) -> np.ndarray:
    """The quotes of ``win`` (positions, ascending) that are not escaped, ``run`` backslashes
    ending the text before it."""
    backslash = win == _BACKSLASH
    if not backslash.any() and not run:
        return quotes
    # Each run of backslashes: where it starts and the byte after it, which it escapes when
    # the run is odd. A run begun before the window starts ``run`` bytes before it.
    before = np.empty(win.size, bool)
    before[0] = run > 0
    before[1:] = backslash[:-1]
    starts = np.flatnonzero(backslash & ~before)
    ends = np.flatnonzero(before & ~backslash)
    if before[0]:
        starts = np.concatenate(([-run], starts))
    starts = starts[: ends.size]  # a run that reaches the window's end escapes nothing here
    escaped = ends[(ends - starts) % 2 == 1]
    if not escaped.size:
        return quotes
    backslash[:] = False  # reused as the mask of escaped bytes
    backslash[escaped] = True
    real: np.ndarray = quotes[~backslash[quotes]]
    return real


def _trailing_backslashes(win: np.ndarray, run: int) -> int:
    """The backslashes that end the text through ``win``, ``run`` ending it before."""
    if win.size == 0 or win[-1] != _BACKSLASH:
        return 0
    others = np.flatnonzero(win != _BACKSLASH)
    if others.size == 0:
        return run + win.size
    return int(win.size - 1 - others[-1])
