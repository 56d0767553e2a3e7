"""LiLiCorrError: expected bad input, printed as one line; exit 2 for a usage error, 1 otherwise."""

from __future__ import annotations


def describe(what: str, where: str | None = None, fix: str | None = None) -> str:
    """`what (where): fix`, the parts that are given."""
    text = f"{what} ({where})" if where else what
    return f"{text}: {fix}" if fix else text


class LiLiCorrError(Exception):
    """Expected bad input: LiLiCorrError("a whole message") or LiLiCorrError(what, where=..., fix=...)."""

    exit_code = 1

    def __init__(self, what: str, *, where: str | None = None, fix: str | None = None) -> None:
        self.what, self.where, self.fix = what, where, fix
        super().__init__(describe(what, where, fix))

    def located(self, where: str) -> "LiLiCorrError":
        """This error naming `where` when it names no place (its message split at its first "; "); else itself."""
        if self.where is not None or type(self).__init__ is not LiLiCorrError.__init__:
            return self
        what, fix = self.what, self.fix
        if fix is None and "; " in what:
            what, fix = what.split("; ", 1)
        located = type(self).__new__(type(self))
        LiLiCorrError.__init__(located, what.rstrip(". "), where=where, fix=None if fix is None else fix.rstrip(". "))
        return located


class UsageError(LiLiCorrError, ValueError):
    """A command-line argument that cannot work (missing path, a folder not to write, out of range); exit 2."""

    exit_code = 2
