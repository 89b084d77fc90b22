"""Schemathesis over the OpenAPI schema: generated requests (valid and invalid) never get a 5xx,
and every answer matches the documented status codes, content types and schemas.

Runs against its own app (own data folder, a queue no worker consumes), so the jobs that valid
generated requests create never train."""

from __future__ import annotations

import uuid

import pytest
import schemathesis
from schemathesis import GenerationMode
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance, response_headers_conformance]


@pytest.fixture(scope="module")
def fuzz_app(tmp_path_factory, redis_url, service_settings):
    from app.main import create_app

    fuzz_settings = service_settings.model_copy(update={
        "data_dir": tmp_path_factory.mktemp("tide-fuzz"), "queue": f"tide-fuzz-{uuid.uuid4().hex[:12]}", "readyz_timeout_s": 0.2,
    })
    app = create_app(fuzz_settings)
    yield app
    import redis

    client = redis.Redis.from_url(fuzz_settings.redis_url)
    for key in client.scan_iter(match=f"*{fuzz_settings.queue}*"):
        client.delete(key)
    client.close()


@pytest.fixture(scope="module")
def fuzz_auth(fuzz_app) -> dict[str, str]:
    from app.db.keys import create_key

    with fuzz_app.state.sessions() as session:
        return {"Authorization": f"Bearer {create_key(session, 'fuzz')[1]}"}


@pytest.fixture(scope="module")
def api_schema(fuzz_app):
    return schemathesis.openapi.from_asgi("/openapi.json", fuzz_app)


def _fuzz(operation, mode, headers, max_examples: int) -> None:
    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(max_examples=max_examples, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True, database=None)
    def run(case) -> None:
        case.call_and_validate(headers=headers, checks=CHECKS)

    run()


# schemathesis' pytest plugin (schema.parametrize) does not run under pytest 9, so each operation
# is driven through its hypothesis strategy here; every failure is collected, not just the first.
@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=lambda m: m.value)
def test_openapi_contract(api_schema, fuzz_auth, mode):
    failures = []
    # /readyz answers a documented 503 here on purpose (no worker listens); tested on its own
    operations = [result.ok() for result in api_schema.get_all_operations()]
    operations = [op for op in operations if op.path != "/readyz"]
    assert len(operations) >= 12
    for operation in operations:
        for headers, examples in ((fuzz_auth, 12), ({}, 2)):
            try:
                _fuzz(operation, mode, headers, examples)
            except Unsatisfiable:
                pass  # nothing in this operation can be made invalid (no parameters, no body)
            except (Exception, BaseExceptionGroup) as exc:  # gathered and reported together below
                failures.append(f"{operation.label} ({'with' if headers else 'without'} key): {exc}")
    assert not failures, "\n\n".join(failures)
