"""Public key combinations of group keys: :class:`KeyTuples` of public tables, key blocks and domains.

Part of :mod:`dpgate.policy`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Protocol

if TYPE_CHECKING:
    from dpgate.policy.columns import ColumnPolicy


@dataclass(frozen=True, eq=False)
class KeyTuples:
    """The distinct rows of the key columns of one public table, as they occur together there.

    A public table holds nothing to protect, so which combinations of its columns' values exist
    is public. Group keys taken from several columns of one public table release those
    combinations — never the product of the columns' key lists, whose other pairs no row of the
    table (hence no joined row) can have (issue 19 item 5). Read from the data source by the
    gateway (:meth:`dpgate.service.Gateway._with_public_table_keys`) and carried by the public
    table, and by a joined table for each occurrence of it (column names renamed).

    Attributes:
        columns: the key columns (names in the table that carries this).
        rows: one tuple per distinct row of those columns in the public table (NULLs kept), or
            None when the table has more distinct rows than the gateway reads (grouping by
            several of these columns is then refused).
    """

    columns: tuple[str, ...]
    rows: tuple[tuple, ...] | None
    _projected: dict = field(default_factory=dict, repr=False, compare=False)

    def renamed(self, names: Mapping[str, str]) -> "KeyTuples":
        """The same rows under other column names (``names``: old → new)."""
        return KeyTuples(tuple(names[c] for c in self.columns), self.rows)

    def project(self, columns: "tuple[ColumnPolicy, ...]") -> tuple[tuple, ...]:
        """The distinct combinations of ``columns`` (some of :attr:`columns`, each with public
        keys) in the rows: a row with a NULL or a value outside a column's public keys is left
        out (no joined row can have it as a key: the bounding drops such rows). In public-key
        order, the first column slowest: the order in which the product of the keys lists them.

        Raises:
            UnsupportedQuery: the rows are unknown (more than the gateway reads).
        """
        from dpgate.errors import UnsupportedQuery

        key = tuple(c.name for c in columns)
        cache_key = tuple((c.name, c.public_keys) for c in columns)  # narrowed keys project differently
        if cache_key in self._projected:
            return self._projected[cache_key]
        if self.rows is None:
            raise UnsupportedQuery(
                f"the group keys {', '.join(key)} come from one public table with more distinct rows "
                "than the gateway reads to enumerate their combinations: group by fewer of its columns",
                {"columns": list(key)})
        positions = [self.columns.index(n) for n in key]
        ordinals = []
        for c in columns:
            keys = c.public_keys
            if isinstance(keys, range):
                ordinals.append(lambda v, r=keys: v - r.start if isinstance(v, int) and not isinstance(v, bool)
                                and v in r else None)
            else:
                index = {(type(v), v): i for i, v in enumerate(keys) if v is not None}
                ordinals.append(lambda v, ix=index: ix.get((type(v), v)))
        found: dict[tuple, tuple] = {}
        for row in self.rows:
            values = tuple(row[i] for i in positions)
            order = tuple(f(v) for f, v in zip(ordinals, values))
            if None not in order:
                found[order] = values
        out = tuple(found[o] for o in sorted(found))
        self._projected[cache_key] = out
        return out


class _HasKeyTuples(Protocol):
    """What the key enumeration reads of a table (a :class:`~dpgate.policy.TablePolicy`): its public
    tables' key tuples. A protocol, so that this module does not import the tables module (which
    imports it)."""

    key_tuples: tuple["KeyTuples", ...]


def key_blocks(table: _HasKeyTuples, names: Iterable[str]) -> list[tuple[int, ...]]:
    """The positions of group keys ``names`` enumerated together, in order of first position.

    Two or more of ``names`` that are columns of one :class:`KeyTuples` of ``table`` form one
    block (their combinations are the public table's tuples); every other name is a block of
    its own (its public keys, or a computed key's domain).
    """
    names = list(names)
    blocks: list[list[int]] = []
    owner: dict[int, int] = {}
    for kt in table.key_tuples:
        members = [i for i, n in enumerate(names) if n in kt.columns]
        if len(members) > 1:
            for i in members:
                owner[i] = len(blocks)
            blocks.append(members)
    out: list[tuple[int, ...]] = []
    done: set[int] = set()
    for i in range(len(names)):
        if i in owner:
            if owner[i] not in done:
                done.add(owner[i])
                out.append(tuple(blocks[owner[i]]))
        else:
            out.append((i,))
    return out


def key_domain(table: _HasKeyTuples, names: Iterable[str], columns: Iterable["ColumnPolicy"]
               ) -> list[tuple[tuple[int, ...], Any]]:
    """The released key combinations of group keys ``names`` (their columns ``columns``, each
    with public keys), one ``(positions, values)`` per block of :func:`key_blocks`: a block of
    one key lists its public keys (a tuple or a range); a block of several columns of one
    public table lists their tuples (:meth:`KeyTuples.project`). The released rows are the
    product of the blocks, in order, the first slowest.

    Raises:
        ValueError: a key has no public keys. UnsupportedQuery: see :meth:`KeyTuples.project`.
    """
    names, columns = list(names), list(columns)
    for n, c in zip(names, columns):
        if c.public_keys is None:
            raise ValueError(f"group key {n!r} has no public keys")
    out = []
    for block in key_blocks(table, names):
        if len(block) == 1:
            out.append((block, columns[block[0]].public_keys))
            continue
        kt = next(k for k in table.key_tuples if names[block[0]] in k.columns)
        out.append((block, kt.project(tuple(columns[i] for i in block))))
    return out
