"""The class list: an allow-list given by the user, checked against what a source holds."""

from __future__ import annotations

from typing import Iterable

from components.dataio import data


def parse_classes(classes: str | Iterable[str] | None) -> list[str] | None:
    """`classes` as a list (None: any), from a comma-separated string or a list; refuses blanks and repeats."""
    if classes is None:
        return None
    names = [c.strip() for c in classes.split(",")] if isinstance(classes, str) else [str(c).strip() for c in classes]
    if not any(names):
        return None
    if "" in names:
        raise data.DataError(f"classes has an empty name: {classes!r} (give names separated by commas)")
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise data.DataError(f"classes lists {', '.join(repeated)} more than once")
    return names


def check_class_count(names: list[str], where: str) -> None:
    if len(names) < 2:
        found = f": {', '.join(repr(n) for n in names)}" if names else ""
        raise data.DataError(f"Need at least 2 classes to train a classifier, found {len(names)} in {where}{found}")


def apply_allow_list(source_names: list[str], classes: list[str] | None, where: str) -> tuple[list[str], list[int]]:
    """Class names to use and the map from the source's label numbers to them (the allow-list's order)."""
    if classes is None:
        return source_names, list(range(len(source_names)))
    not_allowed = [n for n in source_names if n not in classes]
    if not_allowed:
        raise data.DataError(f"{where} has class(es) {', '.join(repr(n) for n in not_allowed)} that are not in "
                             f"the allowed classes ({', '.join(classes)}): remove them or add them to classes")
    missing = [n for n in classes if n not in source_names]
    if missing:
        raise data.DataError(f"Class(es) {', '.join(repr(n) for n in missing)} from the allowed classes are not "
                             f"in {where} (it has {', '.join(source_names)})")
    return classes, [classes.index(n) for n in source_names]
