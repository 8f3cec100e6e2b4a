"""Stage: report (numbers).  A number shown with an interval gets only the digits the interval
supports: the half-width's first significant digit (two where that digit is 1, so 1.4 is not read
as 1) sets the last decimal place of the value and its bounds alike.  ``most`` caps the decimals, so
a very narrow interval does not print more digits than the reader needs.  Without a finite interval
the value keeps ``most`` decimals.
"""

from __future__ import annotations

import math


def decimals(lo: float, hi: float, most: int = 1) -> int:
    """Decimal places the interval [lo, hi] supports, at most ``most``; negative: round to tens, ..."""
    half = (hi - lo) / 2 if all(isinstance(v, (int, float)) and math.isfinite(v) for v in (lo, hi)) else math.nan
    if not half > 0:
        return most
    exp = math.floor(math.log10(half))
    digits = 2 if half / 10 ** exp < 2 else 1
    return min(most, digits - 1 - exp)


def num(v: float, places: int) -> str:
    """``v`` rounded to ``places`` decimals (negative: to tens, hundreds, ...); "–" when not finite.
    Minus signs are the typographic one."""
    if not (isinstance(v, (int, float)) and math.isfinite(v)):
        return "–"
    text = f"{v:.{places}f}" if places >= 0 else f"{round(v, places):.0f}"
    return text.lstrip("-") if float(text) == 0 else text.replace("-", "−")


def with_ci(v: float, lo: float, hi: float, *, scale: float = 1.0, most: int = 1, unit: str = "") -> str:
    """"v [lo, hi]" at the precision the interval supports; "v" alone where it has no bounds."""
    if not (isinstance(v, (int, float)) and math.isfinite(v)):
        return "–"
    v, lo, hi = v * scale, lo * scale, hi * scale
    places = decimals(lo, hi, most)
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return f"{num(v, places)}{unit}"
    return f"{num(v, places)}{unit} [{num(lo, places)}, {num(hi, places)}]"


def rounded(v: float, lo: float, hi: float, *, scale: float = 1.0, most: int = 1) -> str:
    """``v`` alone, at the precision its interval [lo, hi] supports (the interval shown elsewhere)."""
    return num(v * scale, decimals(lo * scale, hi * scale, most))
