"""The config loader against arbitrary input: random YAML documents built from
connectors.yaml's own words, random text and random bytes. Every input gives a
validated deployment or a coded :class:`CdcflowError` — never another exception."""

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdcflow.core.config import load_deployment
from cdcflow.core.config.loader import Deployment
from cdcflow.core.errors import CdcflowError, ConfigInvalidError
from cdcflow.core.plugin import PluginManager

PM = PluginManager.default(autoload=False)

#: Keys and values of connectors.yaml, so that random documents reach the plugin models.
KEYS = [
    "server",
    "connectors",
    "name",
    "source",
    "sinks",
    "scheduler",
    "type",
    "uri",
    "pd",
    "start-ts",
    "target-ts",
    "memory-quota",
    "spill-disk-quota",
    "error-stuck-duration",
    "filter",
    "rules",
    "metastore",
    "api-addr",
    "gc-ttl",
    "spark",
    "protocol",
    "topic",
    "partition-num",
    "sasl-password",
    "path",
    "x",
]
TEXT_VALUES = [
    "tikv",
    "file",
    "kafka",
    "mysql",
    "spark",
    "two-phase",
    "now",
    "1GiB",
    "16KiB",
    "30s",
    "1e39GiB",
    "file:///tmp/out",
    "kafka://mock/t",
    "kafka://[::1/t",
    "kafka://h:99999/t",
    "mysql://u:p@w@h:3306/",
    "spark://?mode=changelog",
    "sqlite:///tmp/m.db",
    "127.0.0.1:0",
    "*.*",
    "${HOME}",
    "${NOPE}",
    "",
]

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(TEXT_VALUES),
    st.text(max_size=20),
)
documents = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(st.one_of(st.sampled_from(KEYS), st.text(max_size=8)), children, max_size=5),
    ),
    max_leaves=30,
)

YAML_PIECES = [
    "&a ",
    "*a",
    "<<: ",
    "!!python/object:os.system ",
    "!!binary ",
    "? ",
    "- ",
    ": ",
    "{",
    "}",
    "[",
    "]",
    "\n",
    "  ",
    "'",
    '"',
    "#",
    "%YAML 1.1\n",
    "---\n",
    "...\n",
    "|\n",
    ">-\n",
    "\t",
    "\x00",
    "\ufeff",
]
yaml_like = st.lists(st.one_of(st.sampled_from(YAML_PIECES + KEYS + TEXT_VALUES), st.text(max_size=5)), max_size=40)


def check(tmp_path, data: bytes) -> None:
    path = tmp_path / "connectors.yaml"
    path.write_bytes(data)
    try:
        result = load_deployment(path, PM, env={"HOME": "/root"})
    except ConfigInvalidError as exc:
        assert exc.code is not None and str(exc)
        return
    except CdcflowError as exc:  # pragma: no cover - any other coded error is acceptable too
        assert exc.code is not None
        return
    assert isinstance(result, Deployment)


FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@FUZZ
@given(documents)
def test_random_documents(tmp_path, document):
    text = yaml.safe_dump(document, allow_unicode=True) if not isinstance(document, str) else document
    check(tmp_path, text.encode("utf-8", "surrogatepass"))


@FUZZ
@given(st.fixed_dictionaries({"connectors": st.lists(st.dictionaries(st.sampled_from(KEYS), documents), max_size=2)}))
def test_random_connectors(tmp_path, document):
    check(tmp_path, yaml.safe_dump(document, allow_unicode=True).encode("utf-8", "surrogatepass"))


@FUZZ
@given(yaml_like)
def test_random_yaml_text(tmp_path, pieces):
    check(tmp_path, "".join(pieces).encode("utf-8", "surrogatepass"))


@FUZZ
@given(st.binary(max_size=200))
def test_random_bytes(tmp_path, data):
    check(tmp_path, data)
