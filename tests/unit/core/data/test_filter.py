import pytest

from cdcflow.core.data.filter import FilterRuleError, TableFilter


@pytest.mark.parametrize(
    ("rules", "schema", "table", "expected"),
    [
        (["*.*"], "shop", "orders", True),
        (["shop.*"], "shop", "orders", True),
        (["shop.*"], "crm", "orders", False),
        (["shop.*", "!shop.tmp_*"], "shop", "tmp_1", False),
        (["!shop.tmp_*", "shop.*"], "shop", "tmp_1", True),
        (["shop.order?"], "shop", "orders", True),
        (["shop.order?"], "shop", "order", False),
        (["db[0-9].t"], "db3", "t", True),
        (["db[!0-9].t"], "db3", "t", False),
        (["SHOP.Orders"], "shop", "orders", True),
        (["`my.db`.`t*`"], "my.db", "t*", True),
        (["`my.db`.`t*`"], "my.db", "tx", False),
        (["*.*"], "mysql", "user", False),
        (["*.*"], "INFORMATION_SCHEMA", "tables", False),
    ],
)
def test_matches(rules, schema, table, expected):
    assert TableFilter(rules).matches(schema, table) is expected


def test_case_sensitive():
    assert not TableFilter(["SHOP.*"], case_sensitive=True).matches("shop", "t")


@pytest.mark.parametrize("bad", ["noschema", "a.", ".b", "`a.b", "a.[x", "a.b`c`"])
def test_bad_rules(bad):
    with pytest.raises(FilterRuleError):
        TableFilter([bad])
    assert TableFilter.check(bad)


def test_ddl_of_matched_tables_and_renames_in_or_out_of_the_filter_are_replicated():
    from cdcflow.core.data.events import DDLEvent, TableName
    from cdcflow.core.data.filter import replicates_ddl

    f = TableFilter(["shop.*"])
    shop, other = TableName("shop", "a", 7), TableName("crm", "a", 7)
    assert replicates_ddl(f, DDLEvent(1, "ALTER TABLE ...", shop))
    assert not replicates_ddl(f, DDLEvent(1, "ALTER TABLE ...", other))
    assert not replicates_ddl(f, DDLEvent(1, "CREATE DATABASE crm"))  # schema-level
    # RENAME: the old name or the new one in the filter is enough.
    assert replicates_ddl(f, DDLEvent(1, "RENAME TABLE ...", other, 14, renamed_from=shop))
    assert replicates_ddl(f, DDLEvent(1, "RENAME TABLE ...", shop, 14, renamed_from=other))
    assert not replicates_ddl(f, DDLEvent(1, "RENAME TABLE ...", other, 14, renamed_from=TableName("crm", "b", 7)))
