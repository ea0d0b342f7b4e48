"""The validated query plan: what the gateway will compute, independent of SQL spelling.

A :class:`QueryPlan` is built only by :func:`dpgate.sql.parse.parse_query` from
an analyst's SQL text that passed the allow-list. Everything downstream (the
bounding rewrite, sensitivity, calibration, post-processing, the release cache
key) reads the plan, never the analyst's text.

Vocabulary:

* a *noisy primitive* (:class:`Primitive`) is one per-group integer aggregate
  that the bounded SQL computes and the mechanism noises: a row count, a
  non-NULL count of a column, a count of distinct privacy units, a clamped
  fixed-point sum, or a clamped fixed-point sum of squares;
* an *output* is a column of the released table: a group key
  (:class:`KeyOutput`) or an aggregate (:class:`AggregateOutput`) derived from
  one or more primitives by post-processing (AVG = sum / count, VAR_POP from
  the sum of squares, the sum and the count).

Every output has a canonical ``name`` (``count``, ``sum_tokens``, the key's column
name, with ``_2``, ``_3``… appended on a clash), which HAVING and ORDER BY refer
to, and a ``label``: the analyst's alias or the aggregate as written, used as the
released column's title. Labels are presentation: they are excluded from the
plan hash and from plan equality, so ``COUNT(*) AS n`` and ``COUNT(*) AS total``
have the same plan hash.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal, Mapping

import sqlglot
from sqlglot import exp

if TYPE_CHECKING:  # pragma: no cover
    from dpgate.policy import ColumnPolicy, TablePolicy
    from dpgate.sql.sources import Source

PrimitiveKind = Literal["count", "count_column", "count_distinct_unit", "count_distinct", "sum", "sum_squares",
                        "quantile"]
AggregateFunction = Literal[
    "count", "count_column", "count_distinct_unit", "count_distinct", "sum", "avg", "var_pop", "stddev_pop",
    "quantile", "min", "max",
]

#: Primitives each aggregate function is computed from, in this order.
FUNCTION_PRIMITIVES: Mapping[str, tuple[PrimitiveKind, ...]] = {
    "count": ("count",),
    "count_column": ("count_column",),
    "count_distinct_unit": ("count_distinct_unit",),
    # COUNT(DISTINCT col) of a non-unit column: each unit keeps at most m distinct values per
    # group (issue 11; dpgate.sql.bound, dpgate.sensitivity)
    "count_distinct": ("count_distinct",),
    "sum": ("sum",),
    "avg": ("sum", "count_column"),
    "var_pop": ("sum_squares", "sum", "count_column"),
    "stddev_pop": ("sum_squares", "sum", "count_column"),
    # quantiles (dpgate.quantiles): one exponential-mechanism release of the α-quantile;
    # MIN/MAX are the 0- and 1-quantiles
    "quantile": ("quantile",),
    "min": ("quantile",),
    "max": ("quantile",),
}


@dataclass(frozen=True)
class DerivedValue:
    """A row expression aggregated by a primitive, with the clamp derived from the policy.

    ``SUM(CASE WHEN income > 50000 THEN 1 ELSE 0 END)`` aggregates the expression; its
    range [0, 1] follows from the policy's declared bounds by interval arithmetic
    (:mod:`dpgate.sql.expr`), never from data, and becomes the clamp of the per-row
    value, exactly as a declared column's ``[lower, upper]`` does. Primitives and outputs
    refer to it by ``expression`` in their ``column`` field.

    Attributes:
        expression: canonical DuckDB SQL of the expression over declared columns
            (double-quoted names); also its name in the plan.
        type: ``"int"`` or ``"float"`` (booleans are 0/1 ints).
        lower, upper: the derived clamp (exact multiples of ``resolution``).
        resolution: fixed-point step of sums (1 for int expressions).
        range: the derived range as written for humans (``[0, 1]``).
    """

    expression: str
    type: str
    lower: float
    upper: float
    resolution: float
    range: str = ""

    def column_policy(self) -> "ColumnPolicy":
        """The value as a bounded column (what the bounding rewrite and sensitivity read)."""
        from dpgate.policy import ColumnPolicy

        return ColumnPolicy(name=self.expression, type=self.type, lower=self.lower,
                            upper=self.upper, resolution=self.resolution)


@dataclass(frozen=True)
class Primitive:
    """One noisy primitive, computed per group by the bounded SQL as an integer.

    Attributes:
        id: column name of this primitive in the bounded SQL's result
            (``"p0"``, ``"p1"``, …; generated, never taken from the query; prefixed
            with underscores if the table declares a column of that name).
        kind: ``count`` (rows, at most m per unit and group), ``count_column``
            (non-NULL, finite values of ``column``), ``count_distinct_unit``
            (distinct privacy units), ``sum`` (clamped values of ``column`` in
            fixed-point units of its ``resolution``), ``sum_squares`` (squares of
            the clamped fixed-point values, units of ``resolution**2``), ``quantile``
            (the index of the ``alpha``-quantile's candidate on the column's grid,
            chosen by the exponential mechanism; :mod:`dpgate.quantiles`).
        column: the declared column (or a :class:`DerivedValue`'s expression), or None
            for ``count`` and ``count_distinct_unit``.
        alpha: the quantile in [0, 1] for ``quantile`` primitives, else None (then
            left out of the canonical form, so other plans keep their hashes).
    """

    id: str
    kind: PrimitiveKind
    column: str | None = None
    alpha: float | None = None


@dataclass(frozen=True)
class KeyOutput:
    """A released group-key column (values come from the policy's public keys).

    Attributes:
        name: canonical output name (the column name).
        column: the declared group-by column.
        hidden: True when the key is grouped by but not selected.
        label: released column title (the analyst's alias or the column as written);
            not part of the plan hash.
    """

    name: str
    column: str
    hidden: bool = False
    label: str = field(default="", compare=False)


@dataclass(frozen=True)
class AggregateOutput:
    """A released aggregate column, derived from noisy primitives by post-processing.

    Attributes:
        name: canonical output name (``count``, ``count_x``, ``count_distinct_<unit>``,
            ``sum_x``, ``avg_x``, ``var_pop_x``, ``stddev_pop_x``; ``_2``… on a clash).
        function: the aggregate after alias resolution (``VARIANCE``/``VAR_SAMP`` →
            ``var_pop``, ``STDDEV``/``STDDEV_SAMP`` → ``stddev_pop``, ``MEAN`` → ``avg``,
            ``COUNT(1)`` and ``COUNT(<unit>)`` → ``count``, …). The DP estimate of a
            variance or standard deviation is always the population one.
        column: the declared column aggregated, or None for ``count`` and
            ``count_distinct_unit``.
        primitives: ids of the primitives it is computed from, in this order:
            count → (count,); count_column → (count_column,);
            count_distinct_unit → (count_distinct_unit,); sum → (sum,);
            avg → (sum, count_column); var_pop and stddev_pop →
            (sum_squares, sum, count_column).
        hidden: True when only HAVING or ORDER BY refers to it (computed and
            noised, but not released as a column).
        label: released column title; not part of the plan hash.
    """

    name: str
    function: AggregateFunction
    column: str | None
    primitives: tuple[str, ...]
    hidden: bool = False
    label: str = field(default="", compare=False)


@dataclass(frozen=True)
class DerivedOutput:
    """A released column computed after the release from other outputs (post-processing).

    ``SUM(age) * 1``, ``POWER(AVG(x), 2)``, ``ROUND(AVG(x), 1)``, ``CASE WHEN SUM(x) > 10 THEN
    'high' END``, ``3 AS three``: a deterministic expression over released cells (aggregate
    outputs, hidden when not selected themselves, and group keys) and constants, evaluated by
    :func:`dpgate.postprocess.derived_cell` on the noisy values. It costs nothing (post-processing
    of a DP release is DP, Dwork & Roth 2014, Prop. 2.1) and shares the noisy primitives of the
    bare query, so ``SUM(age) * 1`` after ``SUM(age)`` is served from the stored release.

    Attributes:
        name: canonical output name (``expr``, ``expr_2``…).
        expression: canonical DuckDB SQL of the expression over output names (double-quoted).
        hidden: True for an ``ORDER BY`` expression that is not selected (``ORDER BY
            CAST(educ AS INTEGER)``): computed to sort by, not released.
        label: released column title; not part of the plan hash.
    """

    name: str
    expression: str
    hidden: bool = False
    label: str = field(default="", compare=False)


Output = KeyOutput | AggregateOutput | DerivedOutput


class PlanTrees:
    """The compiler's own trees of a plan's canonical texts (issue 20 step 3, "typed expressions
    stay typed"): built once while planning, read by everything downstream (the renderers, the
    constant-plan rule, post-processing), so that no canonical text is parsed again.

    Each tree equals ``sqlglot.parse_one(<its text>, read="duckdb")`` (the text is generated from
    it; tests/test_plan_trees.py checks the equality over the golden and corpus plans). Not part of
    the plan's canonical form, equality or JSON form: the texts are (plan hashes are persisted).
    Read through :meth:`QueryPlan.where_tree` and its siblings, which hand out copies (the trees
    here are never mutated) and parse the text only for a plan without trees (one rebuilt from a
    stored document, :meth:`QueryPlan.from_dict`).

    Attributes:
        where: the row predicate over declared columns (``QueryPlan.where``), or None.
        having: the HAVING predicate over output names (``QueryPlan.having``), or None.
        derived: derived output name → its expression over output names
            (``DerivedOutput.expression``).
        keys: computed key name → its expression over declared columns (``ComputedKey.expression``).
        values: an aggregated expression's text → its tree (``DerivedValue.expression``).
    """

    __slots__ = ("where", "having", "derived", "keys", "values")

    def __init__(self, where: exp.Expression | None = None, having: exp.Expression | None = None,
                 derived: Mapping[str, exp.Expression] | None = None,
                 keys: Mapping[str, exp.Expression] | None = None,
                 values: Mapping[str, exp.Expression] | None = None) -> None:
        self.where = where
        self.having = having
        self.derived = dict(derived or {})
        self.keys = dict(keys or {})
        self.values = dict(values or {})

    def __deepcopy__(self, memo: dict) -> "PlanTrees":  # dataclasses.asdict deep-copies field values
        return self

    def __repr__(self) -> str:
        return "PlanTrees(...)"


def _tree(tree: exp.Expression | None, text: str | None) -> exp.Expression | None:
    """A copy of ``tree``, or ``text`` parsed when the plan has no tree (a stored plan)."""
    if tree is not None:
        return tree.copy()
    return None if text is None else sqlglot.parse_one(text, read="duckdb")


#: How a computed key's domain follows from the policy (:mod:`dpgate.sql.keys`).
KeyRule = Literal["case_literals", "predicate", "enumerated", "listed"]


@dataclass(frozen=True)
class ComputedKey:
    """A GROUP BY key computed from declared columns, with a domain that follows from the
    policy alone (never from data); released in full like public keys.

    Attributes:
        name: canonical name (``g0``, ``g1``, … in canonical order; prefixed with
            underscores if a declared column has such a name); the group-key column of
            the bounded SQL's result and the :class:`KeyOutput`'s ``column``.
        expression: canonical DuckDB SQL of the key over declared columns (double-quoted
            names), generated by sqlglot from the validated tree.
        type: ``int`` | ``float`` | ``text`` | ``bool`` (the released values' type).
        domain: every released key value, in release order; ``None`` is the group of rows
            whose key is NULL (a ``CASE`` without ``ELSE``).
        rule: ``case_literals`` (a CASE/IF whose results are literals: the literals, plus
            NULL without ELSE), ``predicate`` (a boolean expression: false, true) or
            ``enumerated`` (every value the expression takes over the inputs' declared
            domains: integer ranges ``[lower, upper]`` and public keys).
        inputs: the declared columns the expression reads. For ``enumerated`` keys, rows
            whose input value is outside its declared domain are dropped (as a value
            outside a public-key list is).
    """

    name: str
    expression: str
    type: str
    domain: tuple
    rule: KeyRule
    inputs: tuple[str, ...] = ()

    def as_column(self):
        """This key as a :class:`~dpgate.policy.ColumnPolicy` whose public keys are the domain."""
        from dpgate.policy import ColumnPolicy

        return ColumnPolicy(name=self.name, type=self.type, public_keys=tuple(self.domain))


@dataclass(frozen=True)
class NarrowedKey:
    """A declared group key whose released keys the WHERE narrows (:mod:`dpgate.sql.narrow`):
    the public keys for which the WHERE's conjuncts over key columns can hold, evaluated on
    the policy's key list (never on data), in the policy's order.

    Attributes:
        column: the declared group-by column.
        keys: the kept keys (empty when ``range`` is set).
        range: ``(start, stop)`` when the kept keys are the integers start … stop − 1 (a
            policy ``range(a, b)`` narrowed to a contiguous run), else None.
    """

    column: str
    keys: tuple = ()
    range: tuple[int, int] | None = None

    @property
    def public_keys(self) -> tuple | range:
        """The kept keys as a column's ``public_keys`` (a ``range`` or a tuple)."""
        return range(*self.range) if self.range is not None else tuple(self.keys)

    def to_dict(self) -> dict[str, Any]:
        """``{"column", "keys"}`` or ``{"column", "range": [start, stop]}`` (JSON-native)."""
        if self.range is not None:
            return {"column": self.column, "range": list(self.range)}
        return {"column": self.column, "keys": list(self.keys)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "NarrowedKey":
        """The inverse of :meth:`to_dict`."""
        r = d.get("range")
        return cls(d["column"], tuple(d.get("keys") or ()), (int(r[0]), int(r[1])) if r is not None else None)


@dataclass(frozen=True)
class OrderItem:
    """One ORDER BY item over the noisy outputs (post-processing).

    Attributes:
        output: canonical output name.
        descending: DESC.
        nulls_first: NULLs (suppressed cells) first; DuckDB's default is NULLS LAST.
    """

    output: str
    descending: bool = False
    nulls_first: bool = False


@dataclass(frozen=True)
class QueryPlan:
    """A validated, canonical aggregate query over one table of one dataset.

    Attributes:
        dataset: dataset name (policy file).
        table: declared table name.
        where: canonical DuckDB SQL of the row predicate over declared columns
            (double-quoted declared names, unqualified; generated by sqlglot from the
            validated AST), or None.
        group_by: group keys: declared columns in the policy's declaration order, then
            computed keys (:class:`ComputedKey` names) in canonical order (also the order
            of the bounded SQL's rows: public-key/domain order, first key slowest).
        primitives: the noisy primitives, deduplicated, ids ``p0``, ``p1``, …
        outputs: the released columns in SELECT order, then hidden ones.
        having: canonical SQL of the HAVING predicate over canonical output names
            (post-processing on noisy values; see :func:`evaluate_predicate`), or None.
        order_by: ORDER BY items over output names (post-processing).
        limit: LIMIT (post-processing), or None.
        offset: OFFSET, the sorted released rows skipped before LIMIT (post-processing); left
            out of the canonical form when 0, so plans without OFFSET keep their hash.
        policy_digest: SHA-256 (hex) of the policy settings the plan depends on (unit,
            k, m and the referenced columns' types, bounds, resolutions and public
            keys), so that a policy change changes the plan hash.
        computed_keys: the computed group keys (:class:`ComputedKey`), empty when every
            key is a declared column.
        canonical_sql: a normalised SQL text of the query, for humans and the
            release record; equal for queries that differ only in spelling.
        selected_keys: group-by columns without public keys, whose values are chosen by
            private partition selection (issue 11; :mod:`dpgate.sql.partition_selection`); empty
            when every key is public. Left out of the canonical form when empty, so the
            plan hashes of queries without selection are unchanged.
        narrowed_keys: declared group keys whose released keys the WHERE narrows
            (:class:`NarrowedKey`, :mod:`dpgate.sql.narrow`); left out of the canonical form
            when empty, so only the plans of such queries have a new hash.
        source: the compiled source node (:mod:`dpgate.sql.sources`: a declared table, a join, a
            per-unit subquery, a unit path) whose canonical name is ``table``; what consumers read
            (:func:`dpgate.sql.sources.plan_source`). Not part of the canonical form, the hash,
            equality or :meth:`to_dict` (``table`` serialises it); None after :meth:`from_dict`.
    """

    dataset: str
    table: str
    where: str | None
    group_by: tuple[str, ...]
    primitives: tuple[Primitive, ...]
    outputs: tuple[Output, ...]
    having: str | None = None
    order_by: tuple[OrderItem, ...] = ()
    limit: int | None = None
    policy_digest: str = ""
    computed_keys: tuple[ComputedKey, ...] = ()
    canonical_sql: str = field(default="", compare=False)
    values: tuple[DerivedValue, ...] = ()

    def column_policy(self, table: "TablePolicy", name: str) -> "ColumnPolicy":
        """The declared column ``name`` of ``table``, or the derived value of that expression.

        Raises:
            UnknownColumn: neither.
        """
        for v in self.values:
            if v.expression == name:
                return v.column_policy()
        return table.column(name)

    def derived(self, name: str | None) -> DerivedValue | None:
        """The derived value named ``name`` (an aggregated expression), or None."""
        for v in self.values:
            if v.expression == name:
                return v
        return None
    selected_keys: tuple[str, ...] = ()
    narrowed_keys: tuple[NarrowedKey, ...] = ()
    offset: int = 0
    source: "Source | None" = field(default=None, compare=False, repr=False)
    trees: PlanTrees | None = field(default=None, compare=False, repr=False)

    def where_tree(self) -> exp.Expression | None:
        """The WHERE as a tree (a copy; :class:`PlanTrees`), or None."""
        return _tree(self.trees.where if self.trees else None, self.where)

    def having_tree(self) -> exp.Expression | None:
        """The HAVING as a tree over output names (a copy), or None."""
        return _tree(self.trees.having if self.trees else None, self.having)

    def derived_tree(self, out: DerivedOutput) -> exp.Expression:
        """A derived output's expression as a tree over output names (a copy)."""
        tree = _tree(self.trees.derived.get(out.name) if self.trees else None, out.expression)
        assert tree is not None
        return tree

    def key_tree(self, key: ComputedKey) -> exp.Expression:
        """A computed key's expression as a tree over declared columns (a copy)."""
        tree = _tree(self.trees.keys.get(key.name) if self.trees else None, key.expression)
        assert tree is not None
        return tree

    def value_tree(self, expression: str) -> exp.Expression:
        """An aggregated expression (:class:`DerivedValue`'s ``expression``) as a tree (a copy)."""
        tree = _tree(self.trees.values.get(expression) if self.trees else None, expression)
        assert tree is not None
        return tree

    def narrowed_key(self, name: str) -> NarrowedKey | None:
        """The narrowing of declared group key ``name`` by the WHERE, or None."""
        for key in self.narrowed_keys:
            if key.column == name:
                return key
        return None

    def computed_key(self, name: str) -> ComputedKey | None:
        """The computed key named ``name``, or None for a declared column."""
        for key in self.computed_keys:
            if key.name == name:
                return key
        return None

    def key_column(self, table, name: str):
        """The :class:`~dpgate.policy.ColumnPolicy` of group key ``name``: the declared column
        (its public keys narrowed by the WHERE when :attr:`narrowed_keys` says so), or the
        computed key as a column whose public keys are its domain.

        Raises:
            UnknownColumn: neither (via ``table.column``).
        """
        key = self.computed_key(name)
        if key is not None:
            return key.as_column()
        col = table.column(name)
        narrowed = self.narrowed_key(name)
        return col if narrowed is None else replace(col, public_keys=narrowed.public_keys)

    def key_domain(self, table, names: tuple[str, ...] | None = None) -> list[tuple[tuple[int, ...], Any]]:
        """The released combinations of the group keys ``names`` (default: every group key) as
        blocks of positions in ``names`` with their values (:func:`dpgate.policy.key_domain`):
        a key's public keys or computed domain, or, for several columns of one public table,
        the tuples that occur in it (never the product of their keys).

        Raises:
            ValueError: a key has no public keys (a selected key).
        """
        from dpgate.policy import key_domain

        names = self.group_by if names is None else names
        return key_domain(table, names, [self.key_column(table, n) for n in names])

    def key_combinations(self, table, names: tuple[str, ...] | None = None) -> int:
        """Number of combinations of the group keys ``names`` (default: every group key; 1 when
        none): the product over :meth:`key_domain`'s blocks of their sizes.

        Raises:
            ValueError: a key has no public keys (a selected key).
        """
        total = 1
        for _, values in self.key_domain(table, names):
            total *= len(values)
        return total

    def canonical_dict(self) -> dict:
        """JSON-serialisable canonical form (everything that changes the meaning).

        Output labels and ``canonical_sql`` are excluded: renaming an output column
        does not change what is computed. HAVING and ORDER BY refer to canonical
        output names, so they stay meaningful.
        """
        d = _fields(self)
        d.pop("canonical_sql")
        if not d["values"]:  # plans without expressions keep their hash
            d.pop("values")
        if not d["computed_keys"]:  # plans without computed keys keep their earlier hash
            d.pop("computed_keys")
        if not d["selected_keys"]:
            d.pop("selected_keys")
        _narrowed_form(d, self)
        if not d["offset"]:  # plans without OFFSET keep their hash
            d.pop("offset")
        for o in d["outputs"]:
            o.pop("label")
        _drop_empty_alpha(d)
        return d

    @property
    def plan_hash(self) -> str:
        """SHA-256 (hex) of the canonical JSON form; the release cache key's core."""
        payload = json.dumps(self.canonical_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(payload.encode()).hexdigest()

    @property
    def public_group_by(self) -> tuple[str, ...]:
        """The group-by columns with public keys (enumerated), in ``group_by`` order."""
        return tuple(c for c in self.group_by if c not in self.selected_keys)

    def primitive(self, primitive_id: str) -> Primitive:
        """Return the primitive with that id (KeyError if absent)."""
        for p in self.primitives:
            if p.id == primitive_id:
                return p
        raise KeyError(primitive_id)

    def output(self, name: str) -> Output:
        """Return the output with that canonical name (KeyError if absent)."""
        for o in self.outputs:
            if o.name == name:
                return o
        raise KeyError(name)

    @property
    def visible_outputs(self) -> tuple[Output, ...]:
        """The released columns, in SELECT order (hidden outputs left out)."""
        return tuple(o for o in self.outputs if not o.hidden)

    def to_dict(self) -> dict[str, Any]:
        """JSON-native full form (lists, not tuples; with labels, canonical SQL and ``plan_hash``)."""
        d = json.loads(json.dumps(_fields(self)))
        if not d["values"]:
            d.pop("values")
        if not d["computed_keys"]:
            d.pop("computed_keys")
        _drop_empty_alpha(d)
        if not d["selected_keys"]:
            d.pop("selected_keys")
        _narrowed_form(d, self)
        if not d["offset"]:
            d.pop("offset")
        d["plan_hash"] = self.plan_hash
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "QueryPlan":
        """Rebuild a plan from :meth:`to_dict` output (e.g. a stored release).

        Raises:
            KeyError, TypeError: malformed input.
        """
        outputs: list[Output] = []
        for o in d["outputs"]:
            if "expression" in o:
                outputs.append(DerivedOutput(**o))
            elif "function" not in o:
                outputs.append(KeyOutput(**o))
            else:
                outputs.append(AggregateOutput(**{**o, "primitives": tuple(o["primitives"])}))
        return cls(
            dataset=d["dataset"],
            table=d["table"],
            where=d["where"],
            group_by=tuple(d["group_by"]),
            primitives=tuple(Primitive(**p) for p in d["primitives"]),
            outputs=tuple(outputs),
            having=d.get("having"),
            order_by=tuple(OrderItem(**o) for o in d.get("order_by", ())),
            limit=d.get("limit"),
            policy_digest=d.get("policy_digest", ""),
            computed_keys=tuple(
                ComputedKey(**{**k, "domain": tuple(k["domain"]), "inputs": tuple(k.get("inputs", ()))})
                for k in d.get("computed_keys", ())
            ),
            canonical_sql=d.get("canonical_sql", ""),
            values=tuple(DerivedValue(**v) for v in d.get("values", ())),
            selected_keys=tuple(d.get("selected_keys", ())),
            narrowed_keys=tuple(NarrowedKey.from_dict(k) for k in d.get("narrowed_keys", ())),
            offset=int(d.get("offset", 0)),
        )


def _fields(plan: "QueryPlan") -> dict:
    """:func:`dataclasses.asdict` of the plan without its :attr:`~QueryPlan.source` and
    :attr:`~QueryPlan.trees` (never serialised)."""
    d = asdict(plan if plan.source is None and plan.trees is None else replace(plan, source=None, trees=None))
    d.pop("source")
    d.pop("trees")
    return d


def _narrowed_form(d: dict, plan: "QueryPlan") -> None:
    """``narrowed_keys`` in its JSON form (:meth:`NarrowedKey.to_dict`), left out when empty
    (plans whose WHERE narrows no key keep their hash)."""
    if plan.narrowed_keys:
        d["narrowed_keys"] = [k.to_dict() for k in plan.narrowed_keys]
    else:
        d.pop("narrowed_keys", None)


def _drop_empty_alpha(d: dict) -> None:
    """Leave ``alpha`` out of non-quantile primitives (their canonical form predates it)."""
    for p in d["primitives"]:
        if p.get("alpha") is None:
            p.pop("alpha", None)

