"""Property-based checks of the API against its own OpenAPI description (schemathesis, in-process
over the ASGI app and the replayed store): no input makes a server error, and every answer
matches the documented schema."""

from __future__ import annotations

import pytest

schemathesis = pytest.importorskip("schemathesis")
pytest.importorskip("starlette")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from schemathesis import GenerationMode  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402
from schemathesis.specs.openapi.checks import response_schema_conformance  # noqa: E402

from gpulens.web import create_app  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def api_schema(replayed_store):
    return schemathesis.openapi.from_asgi("/api/openapi.json", create_app(store_path=replayed_store))


def test_every_operation_is_fuzzed(api_schema):
    ops = [r.ok() for r in api_schema.get_all_operations()]
    assert {op.path for op in ops} >= {"/api/panel/{panel}", "/api/series", "/api/findings", "/api/events"}


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=["valid", "invalid"])
@pytest.mark.parametrize(
    "path",
    ["/api/health", "/api/meta", "/api/panel/{panel}", "/api/series", "/api/findings", "/api/alerts", "/api/events"],
)
def test_no_server_error_and_answers_match_the_schema(api_schema, path, mode):
    operation = api_schema[path]["GET"]
    if mode == GenerationMode.NEGATIVE and not operation.query and not operation.path_parameters:
        pytest.skip("no parameters to get wrong")

    # schemathesis's pytest plugin does not load under this pytest; drive hypothesis directly.
    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    def check(case):
        case.call_and_validate(checks=[not_a_server_error, response_schema_conformance])

    check()
