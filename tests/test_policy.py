"""Policy files: loading, defaults and every validation error (dpgate.policy)."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import pytest

from dpgate.errors import PolicyError, UnknownColumn, UnknownTable
from dpgate.policy import MAX_FIXED_POINT_STEPS, load_policies, load_policy

FIXTURE = Path(__file__).parent / "fixtures" / "policies" / "planner.toml"

HEAD = """
[dataset]
name = "ds"
population = "people"

[budget]
epsilon = 1.0
delta = 1e-6
default_query_rho = 0.01
"""


def write(tmp_path: Path, body: str, head: str = HEAD, name: str = "ds.toml") -> Path:
    folder = tmp_path / "policies"
    folder.mkdir(exist_ok=True)
    path = folder / name
    path.write_text(textwrap.dedent(head) + textwrap.dedent(body))
    return path


def table(columns: str = "", extra: str = 'privacy_unit = "uid"') -> str:
    return f"""
[tables.t]
source = "data/t.csv"
{extra}

[tables.t.columns]
{columns}
"""


def error(tmp_path: Path, body: str, head: str = HEAD) -> PolicyError:
    path = write(tmp_path, body, head)
    with pytest.raises(PolicyError) as info:
        load_policy(path)
    err = info.value
    assert err.code == "invalid_policy"
    assert str(path) in err.message  # every message names the file
    return err


# --- the fixture and defaults --------------------------------------------------------------


def test_fixture_loads_with_every_field():
    p = load_policy(FIXTURE)
    assert p.name == "planner" and p.population == "planner-people"
    assert p.data_version == "test-1"
    assert p.budget.epsilon == 4.0 and p.budget.delta == 1e-6
    assert p.budget.default_query_rho == 0.001
    assert p.budget.mechanism == "gaussian" and p.budget.clamp_counts is True
    assert p.budget.suppress_ci95_above is None
    assert dict(p.allocations) == {"analysts": 0.5, "dashboard": 0.5}
    prompts = p.table("prompts")
    assert prompts.privacy_unit == "user_id" and not prompts.record_level
    assert (prompts.max_groups_per_unit, prompts.max_rows_per_unit) == (2, 5)
    assert prompts.relation == '"planner"."prompts"'
    assert prompts.source == str(FIXTURE.resolve().parent.parent / "data/prompts.parquet")
    region = prompts.column("region")
    assert region.public_keys == ("eu", "us", "apac", "latam", "africa")
    assert prompts.column("week").public_keys == range(0, 52)
    assert prompts.column("flagged").public_keys == (True, False)
    tokens = prompts.column("tokens")
    assert tokens.bounded and tokens.fixed_point_bounds == (0, 8000)
    assert prompts.column("latency").fixed_point_bounds == (-20, 200)  # [-10, 100] / 0.5
    assert prompts.column("age").resolution == 1.0  # int default
    assert not prompts.column("model").bounded and prompts.column("model").resolution is None
    pums = p.table("pums")
    assert pums.record_level and pums.privacy_unit is None
    assert (pums.max_groups_per_unit, pums.max_rows_per_unit) == (1, 1)
    assert pums.column("income").fixed_point_bounds == (0, 5000)


def test_lookup_is_case_insensitive_and_raises_named_errors():
    p = load_policy(FIXTURE)
    assert p.table("PROMPTS").name == "prompts"
    assert p.table("prompts").column("Region").name == "region"
    with pytest.raises(UnknownTable) as t:
        p.table("nope")
    assert "nope" in t.value.message and t.value.code == "unknown_table"
    with pytest.raises(UnknownColumn) as c:
        p.table("prompts").column("salary")
    assert "salary" in c.value.message and c.value.code == "unknown_column"


def test_optional_budget_fields_and_laplace(tmp_path):
    head = HEAD + 'mechanism = "laplace"\nsuppress_ci95_above = 50\nclamp_counts = false\n'
    p = load_policy(write(tmp_path, table("x = { type = \"int\" }"), head))
    assert p.budget.mechanism == "laplace"
    assert p.budget.suppress_ci95_above == 50.0 and p.budget.clamp_counts is False
    assert dict(p.allocations) == {}


def test_default_k_m_are_one(tmp_path):
    t = load_policy(write(tmp_path, table())).table("t")
    assert (t.max_groups_per_unit, t.max_rows_per_unit) == (1, 1)


def test_float_default_resolution_is_six_significant_digits(tmp_path):
    cols = """
a = { type = "float", lower = 0, upper = 8000 }
b = { type = "float", lower = -0.5, upper = 0.25 }
c = { type = "float", lower = 0, upper = 0 }
d = { type = "float" }
"""
    t = load_policy(write(tmp_path, table(cols))).table("t")
    # 10 ** (floor(log10(max |bound|)) - 6)
    assert t.column("a").resolution == pytest.approx(1e-3)
    assert t.column("a").fixed_point_bounds == (0, 8_000_000)
    assert t.column("b").resolution == pytest.approx(1e-7)
    assert t.column("b").fixed_point_bounds == (-5_000_000, 2_500_000)
    assert t.column("c").resolution == 1e-6 and t.column("c").fixed_point_bounds == (0, 0)
    assert t.column("d").resolution is None and not t.column("d").bounded


def test_fixed_point_bounds_are_exact_multiples(tmp_path):
    # Bounds are compared with the resolution in decimal, as written: 0.3 = 3 × 0.1 exactly
    # (although 0.3/0.1 is 2.9999999999999996 in binary floating point).
    cols = """
a = { type = "float", lower = 0.3, upper = 0.7, resolution = 0.1 }
b = { type = "float", lower = -1.5, upper = 2.5, resolution = 0.5 }
c = { type = "int", lower = 10, upper = 990, resolution = 10 }
"""
    t = load_policy(write(tmp_path, table(cols))).table("t")
    assert t.column("a").fixed_point_bounds == (3, 7)
    assert t.column("b").fixed_point_bounds == (-3, 5)
    assert t.column("c").fixed_point_bounds == (1, 99)


@pytest.mark.parametrize(
    "column, problem",
    [
        # issue 9 item 9: every value 1.0 would be released as 0.9 while the release said 1
        ('x = { type = "float", lower = 0, upper = 1, resolution = 0.3 }',
         "upper = 1 is not a multiple of the resolution 0.3, so the clamp applied would differ "
         "from the published one: use upper = 0.9 or 1.2, or a resolution that divides both "
         "bounds, such as 0.1"),
        ('x = { type = "float", lower = -1.25, upper = 2.75, resolution = 0.5 }',
         "lower = -1.25 is not a multiple of the resolution 0.5, so the clamp applied would "
         "differ from the published one: use lower = -1.5 or -1, or a resolution that divides "
         "both bounds, such as 0.01"),
        ('x = { type = "int", lower = 5, upper = 999, resolution = 10 }',
         "use lower = 0 or 10, or a resolution that divides both bounds, such as 1"),
        ('x = { type = "int", lower = 0.5, upper = 3 }',
         "lower = 0.5 is not a multiple of the resolution 1, so the clamp applied would differ "
         "from the published one: use lower = 0 or 1 (an int column's bounds are whole numbers)"),
    ],
)
def test_bounds_must_be_multiples_of_the_resolution(tmp_path, column, problem):
    assert problem in error(tmp_path, table(column)).message


def test_default_float_resolution_divides_both_bounds(tmp_path):
    cols = """
a = { type = "float", lower = 0, upper = 1234.56789 }
b = { type = "float", lower = 0.001, upper = 8000 }
c = { type = "float", lower = -2.5e-9, upper = 2.5e-9 }
"""
    t = load_policy(write(tmp_path, table(cols))).table("t")
    # six significant digits of the largest bound would be 1e-3; 1234.56789 needs 1e-5
    assert t.column("a").resolution == 1e-5
    assert t.column("a").fixed_point_bounds == (0, 123456789)
    assert t.column("b").resolution == 1e-3 and t.column("b").fixed_point_bounds == (1, 8_000_000)
    assert t.column("c").resolution == 1e-15  # 10 ** (floor(log10 2.5e-9) − 6)
    assert t.column("c").fixed_point_bounds == (-2_500_000, 2_500_000)


def test_default_float_resolution_with_too_many_digits_says_what_to_do(tmp_path):
    # 1e-6 needs a resolution of 1e-6 at most; with 1e20 that is 1e26 steps.
    err = error(tmp_path, table('x = { type = "float", lower = 0.000001, upper = 1e20 }'))
    assert "at most 2**62" in err.message and "round the bounds or give one" in err.message


@pytest.mark.parametrize(
    "column, problem",
    [
        ('x = { type = "float", lower = 0, upper = 1e308 }',
         "upper = 1e+308 is too large: bounds must be at most 1e+100 in magnitude"),
        ('x = { type = "float", lower = -1e101, upper = 0 }', "at most 1e+100"),
        ('x = { type = "int", lower = 0, upper = ' + "9" * 400 + " }", "upper must be finite"),
        ('x = { type = "float", lower = 0, upper = 0, resolution = 1e-300 }',
         "resolution must be between 1e-100 and 1e+100"),
        ('x = { type = "float", lower = 0, upper = 0, resolution = 1e300 }',
         "resolution must be between 1e-100 and 1e+100"),
        ('x = { type = "float", lower = 0, upper = 1e-95 }',
         "resolution must be between 1e-100 and 1e+100 (got 1e-101, the default for these bounds)"),
    ],
)
def test_bounds_and_resolutions_whose_doubles_could_overflow_are_refused(tmp_path, column, problem):
    assert problem in error(tmp_path, table(column)).message


def test_the_largest_accepted_bounds_load(tmp_path):
    t = load_policy(write(tmp_path, table(
        'x = { type = "float", lower = -1e100, upper = 1e100 }\n'
        'y = { type = "float", lower = 0, upper = 0, resolution = 1e-100 }'))).table("t")
    assert t.column("x").resolution == 1e94 and t.column("x").fixed_point_bounds == (-10**6, 10**6)
    assert t.column("y").fixed_point_bounds == (0, 0)


def test_int_bounds_beyond_2_53_stay_exact(tmp_path):
    # 2**53 + 1 is not a double: it is kept as an int, and the clamp is exactly it.
    t = load_policy(write(tmp_path, table(
        f'x = {{ type = "int", lower = {-(2**53 + 1)}, upper = {2**53 + 1} }}'))).table("t")
    col = t.column("x")
    assert col.upper == 2**53 + 1 and col.fixed_point_bounds == (-(2**53 + 1), 2**53 + 1)
    assert col.to_dict()["upper"] == 2**53 + 1


def test_one_units_sum_must_fit_2_62_steps(tmp_path):
    # m · max(|lower|, |upper|) / resolution ≤ 2**62 (limits.MAX_STEPS).
    ok = table(f'x = {{ type = "int", lower = 0, upper = {2**60} }}',
               extra='privacy_unit = "uid"\nmax_rows_per_unit = 4')
    load_policy(write(tmp_path, ok))
    bad = table(f'x = {{ type = "int", lower = 0, upper = {2**60 + 1} }}',
                extra='privacy_unit = "uid"\nmax_rows_per_unit = 4')
    err = error(tmp_path, bad)
    assert "max_rows_per_unit × max(|lower|, |upper|) / resolution" in err.message
    assert "more than 2**62" in err.message


def test_record_level_when_privacy_unit_omitted(tmp_path):
    t = load_policy(write(tmp_path, table(extra="max_groups_per_unit = 1"))).table("t")
    assert t.record_level and t.privacy_unit is None


def test_duckdb_source_and_absolute_paths(tmp_path):
    body = """
[tables.a]
source = "duckdb:warehouse.duckdb:events"
[tables.b]
source = "/abs/file.parquet"
"""
    p = load_policy(write(tmp_path, body))
    assert p.table("a").source == f"duckdb:{tmp_path / 'warehouse.duckdb'}:events"
    assert p.table("b").source == "/abs/file.parquet"


def test_load_policies_folder(tmp_path):
    write(tmp_path, table(), name="a.toml")
    other = HEAD.replace('name = "ds"', 'name = "ds2"')
    write(tmp_path, table(), head=other, name="b.toml")
    (tmp_path / "policies" / "notes.txt").write_text("ignored")
    assert sorted(load_policies(tmp_path / "policies")) == ["ds", "ds2"]


def test_load_policies_duplicate_dataset(tmp_path):
    write(tmp_path, table(), name="a.toml")
    write(tmp_path, table(), name="b.toml")
    with pytest.raises(PolicyError) as e:
        load_policies(tmp_path / "policies")
    assert "'ds'" in e.value.message and "b.toml" in e.value.message


def test_missing_folder(tmp_path):
    with pytest.raises(PolicyError) as e:
        load_policies(tmp_path / "absent")
    assert "absent" in e.value.message


def test_check_data_columns_names_file_table_column():
    t = load_policy(FIXTURE).table("ev")
    t.check_data_columns(["USER_ID", "kind", "extra"])
    with pytest.raises(PolicyError) as e:
        t.check_data_columns(["kind"])
    assert "privacy unit column" in e.value.message
    assert "'ev'" in e.value.message and "'user_id'" in e.value.message
    assert str(FIXTURE) in e.value.message
    with pytest.raises(PolicyError) as e2:
        t.check_data_columns(["user_id"])
    assert "'kind'" in e2.value.message and e2.value.details["column"] == "kind"


def test_key_combinations():
    t = load_policy(FIXTURE).table("prompts")
    assert t.key_combinations([]) == 1
    assert t.key_combinations(["region", "week"]) == 5 * 52
    with pytest.raises(ValueError):
        t.key_combinations(["model"])


# --- validation errors: each names file, table, column and the problem --------------------------


@pytest.mark.parametrize(
    "column, problem",
    [
        ('x = { type = "float", lower = 5, upper = 1 }', "lower (5) > upper (1)"),
        ('x = { type = "float", lower = nan, upper = 1 }', "lower must be finite"),
        ('x = { type = "float", lower = 0, upper = inf }', "upper must be finite"),
        ('x = { type = "float", lower = -inf, upper = 0 }', "lower must be finite"),
        ('x = { type = "float", lower = 0 }', "lower and upper must be given together"),
        ('x = { type = "float", lower = "0", upper = 1 }', "lower must be a number"),
        ('x = { type = "decimal" }', "unknown type 'decimal'"),
        ('x = { type = "int", public_keys = [1, "2"] }', "public key #2 (str) is not a valid int"),
        ('x = { type = "int", public_keys = [1, true] }', "public key #2 (bool) is not a valid int"),
        ('x = { type = "text", public_keys = ["a", 1] }', "public key #2 (int) is not a valid text"),
        ('x = { type = "bool", public_keys = [true, 0] }', "public key #2 (int) is not a valid bool"),
        ('x = { type = "float", public_keys = [1.5, nan] }', "public key #2 (float) is not a valid float"),
        ('x = { type = "text", public_keys = ["a", "b", "a"] }', "duplicate public key 'a'"),
        ('x = { type = "int", public_keys = [3, 3] }', "duplicate public key 3"),
        ('x = { type = "text", public_keys = [] }', "public_keys must not be empty"),
        ('x = { type = "text", public_keys = "range(0, 3)" }', "need an int column"),
        ('x = { type = "int", public_keys = "range(5, 5)" }', "range(5, 5) is empty"),
        ('x = { type = "int", public_keys = "0..5" }', 'must be "range(a, b)"'),
        ('x = { type = "float", lower = 0, upper = 1, resolution = 0 }', "resolution must be > 0"),
        ('x = { type = "float", lower = 0, upper = 1, resolution = -1 }', "resolution must be > 0"),
        ('x = { type = "float", lower = 0, upper = 1, resolution = nan }', "resolution must be finite"),
        ('x = { type = "int", lower = 0, upper = 9, resolution = 0.5 }', "whole number"),
        ('x = { type = "float", lower = 0.5, upper = 1, resolution = 2 }',
         "lower = 0.5 is not a multiple of the resolution 2"),
        ('x = { type = "float", lower = 0, upper = 1e20, resolution = 1 }', "bad resolution: the bounds span"),
        ('x = { type = "text", lower = 0, upper = 1 }', "lower is not allowed on a text column"),
        ('x = { type = "bool", resolution = 1 }', "resolution is not allowed on a bool column"),
        ('x = { type = "int", lowr = 0 }', "unknown key(s) 'lowr'"),
    ],
)
def test_column_errors(tmp_path, column, problem):
    err = error(tmp_path, table(column))
    assert problem in err.message
    assert "table 't'" in err.message and "column 'x'" in err.message
    assert err.details["table"] == "t" and err.details["column"] == "x"


def test_bounds_limit_is_two_to_the_62_steps(tmp_path):
    ok = f'x = {{ type = "int", lower = {-MAX_FIXED_POINT_STEPS}, upper = {MAX_FIXED_POINT_STEPS} }}'
    load_policy(write(tmp_path, table(ok)))
    bad = f'x = {{ type = "int", lower = 0, upper = {MAX_FIXED_POINT_STEPS * 3 // 2} }}'
    assert "bad resolution" in error(tmp_path, table(bad)).message


@pytest.mark.parametrize(
    "extra, problem",
    [
        ('privacy_unit = "uid"\nmax_groups_per_unit = 0', "max_groups_per_unit must be ≥ 1"),
        ('privacy_unit = "uid"\nmax_rows_per_unit = 0', "max_rows_per_unit must be ≥ 1"),
        ('privacy_unit = "uid"\nmax_rows_per_unit = -3', "max_rows_per_unit must be ≥ 1"),
        ('privacy_unit = "uid"\nmax_rows_per_unit = 2.5', "max_rows_per_unit must be an integer"),
        ('privacy_unit = "uid"\nmax_groups_per_unit = true', "max_groups_per_unit must be an integer"),
        ('privacy_unit = "uid"\nmax_rows_per_unit = 2000000', "must be ≤ 1000000"),
        ('privacy_unit = ""', "omit the key for record-level privacy"),
        ("max_rows_per_unit = 3", "needs a privacy_unit column"),
        ('privacy_unit = "uid"\nmax_group_per_unit = 2', "unknown key(s) 'max_group_per_unit'"),
    ],
)
def test_table_errors(tmp_path, extra, problem):
    err = error(tmp_path, table(extra=extra))
    assert problem in err.message and "table 't'" in err.message


def test_unit_column_with_public_keys_is_refused(tmp_path):
    err = error(tmp_path, table('uid = { type = "int", public_keys = [1, 2] }'))
    assert "privacy unit column cannot have public keys" in err.message


def test_columns_differing_only_in_case(tmp_path):
    err = error(tmp_path, table('x = { type = "int" }\nX = { type = "int" }'))
    assert "differ only in case" in err.message


@pytest.mark.parametrize(
    "body, problem",
    [
        ("[allocations]\na = 0.7\nb = 0.4\n" + table(), "allocations sum to 1.1, more than 1"),
        ("[allocations]\na = 0\n" + table(), "allocation 'a' must be in (0, 1]"),
        ("[allocations]\na = -0.1\n" + table(), "allocation 'a' must be in (0, 1]"),
        ("[allocations]\na = nan\n" + table(), "allocation 'a' must be finite"),
        ("", "missing [tables] section"),
        ("[tables]\n", "declares no table"),
        ("[extra]\nx = 1\n" + table(), "unknown key(s) 'extra'"),
        (table().replace('source = "data/t.csv"', ""), "source must be a non-empty string"),
        (table().replace('"data/t.csv"', '"duckdb:file.duckdb"'), "duckdb:<file>:<table>"),
        (table().replace("[tables.t]", '[tables."bad name"]'), "must be a plain identifier"),
    ],
)
def test_file_errors(tmp_path, body, problem):
    assert problem in error(tmp_path, body).message


@pytest.mark.parametrize(
    "head, problem",
    [
        (HEAD.replace("epsilon = 1.0", "epsilon = 0"), "epsilon must be > 0"),
        (HEAD.replace("epsilon = 1.0", "epsilon = inf"), "epsilon must be finite"),
        (HEAD.replace("epsilon = 1.0\n", ""), "[budget] epsilon is required"),
        (HEAD.replace("delta = 1e-6", "delta = 1"), "delta must be in (0, 1)"),
        (HEAD.replace("delta = 1e-6", "delta = 0"), "delta must be in (0, 1)"),
        (HEAD.replace("default_query_rho = 0.01", "default_query_rho = 1e9"), "at most 10000"),
        (HEAD.replace("delta = 1e-6", "delta = -0.1"), "delta must be in (0, 1)"),
        (HEAD.replace("default_query_rho = 0.01", "default_query_rho = 0"), "default_query_rho must be > 0"),
        (HEAD + 'mechanism = "exponential"\n', "mechanism must be one of gaussian, laplace"),
        (HEAD + 'mechanism = ["gaussian"]\n', "mechanism must be one of gaussian, laplace"),
        (HEAD + "clamp_counts = 1\n", "clamp_counts must be true or false"),
        (HEAD + "suppress_ci95_above = -1\n", "suppress_ci95_above must be > 0"),
        (HEAD.replace('name = "ds"', 'name = "my data"'), "must be a plain identifier"),
        (HEAD.replace('population = "people"\n', ""), "population must be a non-empty string"),
        (HEAD.replace('name = "ds"', 'name = "ds"\ndata_version = 3'), "data_version must be a non-empty string"),
        (HEAD.replace("[budget]", "[budgets]"), "unknown key(s) 'budgets'"),
    ],
)
def test_header_errors(tmp_path, head, problem):
    assert problem in error(tmp_path, table(), head).message


def test_toml_syntax_error(tmp_path):
    path = write(tmp_path, "[tables.t\n")
    with pytest.raises(PolicyError) as e:
        load_policy(path)
    assert "TOML syntax error" in e.value.message and str(path) in e.value.message


def test_unreadable_file(tmp_path):
    with pytest.raises(PolicyError) as e:
        load_policy(tmp_path / "missing.toml")
    assert "cannot read" in e.value.message


def test_policies_are_frozen():
    p = load_policy(FIXTURE)
    with pytest.raises(Exception):
        p.name = "x"  # type: ignore[misc]
    with pytest.raises(TypeError):
        p.tables["x"] = None  # type: ignore[index]
    assert math.isfinite(p.budget.epsilon)


def test_repository_policies_load():
    folder = Path(__file__).resolve().parents[1] / "policies"
    if not folder.is_dir():
        pytest.skip("no policies/ folder")
    for policy in load_policies(folder).values():
        assert policy.tables


def test_datasets_of_one_population_must_publish_the_same_cap(tmp_path):
    from dpgate.errors import PolicyError
    from dpgate.policy import load_policies

    body = """
[dataset]
name = "{name}"
population = "shared"
data_version = "1"
[budget]
epsilon = {eps}
delta = 1e-6
default_query_rho = 0.001
[tables.t]
source = "t.csv"
[tables.t.columns]
a = {{ type = "int", public_keys = [0, 1] }}
"""
    folder = tmp_path / "policies"
    folder.mkdir()
    (folder / "g1.toml").write_text(body.format(name="g1", eps=1.0))
    (folder / "g2.toml").write_text(body.format(name="g2", eps=1.0))
    assert set(load_policies(folder)) == {"g1", "g2"}  # same cap: fine
    (folder / "g2.toml").write_text(body.format(name="g2", eps=8.0))
    with pytest.raises(PolicyError) as err:
        load_policies(folder)
    assert "shared" in err.value.message and "g2.toml" in err.value.message
