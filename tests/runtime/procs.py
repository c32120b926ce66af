"""Processes seen through /proc (Linux): the fault tests check that none is left behind."""

from pathlib import Path


def _stat(pid) -> list[str] | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2 :].split()  # state, ppid, ...


def running(pid) -> bool:
    """Whether ``pid`` exists and is not a zombie."""
    fields = _stat(pid)
    return fields is not None and fields[0] != "Z"


def children_by_parent() -> dict[int, list[int]]:
    """Live (non-zombie) processes, grouped by parent pid."""
    out: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = _stat(entry.name)
            if fields is not None and fields[0] != "Z":
                out.setdefault(int(fields[1]), []).append(int(entry.name))
    return out


def descendants(pid) -> list[int]:
    """Every live process below ``pid``."""
    children = children_by_parent()
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out += children.get(p, [])
        todo += children.get(p, [])
    return out
