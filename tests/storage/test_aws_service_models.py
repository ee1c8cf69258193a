"""lancetx's clients are built from trimmed service models (``aws_service_models``).

A trimmed model must keep every operation lancetx calls (a missing one would only
show as an AttributeError on the path that calls it), every shape those operations
and the service's errors reach, and say clearly what happened when something else
is called.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import botocore
import botocore.session
import pytest
from botocore import xform_name

from lancetx.commit.storage import aws_clients
from lancetx.commit.storage.aws_model_cache import CACHE_ENV
from lancetx.commit.storage.aws_service_models import (
    CLIENT_OPERATIONS,
    only_operations,
    trim_service_model,
    without_documentation,
)

ROOT = Path(__file__).resolve().parents[2]
#: The packages whose calls run on lancetx's shared clients.
LIBRARY = ("commit", "externalstore", "lancetx", "pyspark_lancetx", "demo")
#: Operations the library names on clients it builds itself with boto3 (the demos
#: create their bucket), not on lancetx's shared clients.
OWN_CLIENTS = {("s3", "CreateBucket"): ("demo/race.py", "demo/spark.py")}


def full_model(service: str) -> dict[str, Any]:
    model = botocore.session.Session().get_component("data_loader")
    data: dict[str, Any] = json.loads(json.dumps(model.load_service_model(service, "service-2")))
    return data


def test_every_operation_the_library_names_is_kept() -> None:
    """A call of an S3 or DynamoDB operation anywhere in the library (``get_object``,
    ``"PutItem"``) names an operation the trimmed clients have."""
    operations = {
        service: {xform_name(name): name for name in full_model(service)["operations"]}
        for service in CLIENT_OPERATIONS
    }
    named: dict[tuple[str, str], set[str]] = {}
    for package in LIBRARY:
        for path in (ROOT / package).rglob("*.py"):
            if path.name == "aws_service_models.py":
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                words = [node.attr] if isinstance(node, ast.Attribute) else []
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    words.append(node.value)
                for word in words:
                    for service, ops in operations.items():
                        operation = ops.get(word, word if word in ops.values() else None)
                        if operation is not None:
                            where = str(path.relative_to(ROOT))
                            named.setdefault((service, operation), set()).add(where)
    assert ("dynamodb", "TransactWriteItems") in named  # the scan sees plan steps' names
    assert ("s3", "ListObjectsV2") in named  # and client method calls
    missing = {
        key: sorted(where)
        for key, where in named.items()
        if key[1] not in CLIENT_OPERATIONS[key[0]] and where - set(OWN_CLIENTS.get(key, ()))
    }
    assert missing == {}, "add these to CLIENT_OPERATIONS (aws_service_models.py)"


def test_every_operation_botocore_calls_on_a_client_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """botocore calls some operations itself: S3's region redirector (HeadBucket), S3
    Express One Zone (CreateSession), DynamoDB's endpoint discovery (the model's
    endpoint operation). A trimmed client must still have them."""
    operations = {
        service: {xform_name(name): name for name in full_model(service)["operations"]}
        for service in CLIENT_OPERATIONS
    }
    called: set[tuple[str, str]] = set()
    for path in Path(botocore.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                for service, ops in operations.items():
                    if node.func.attr in ops:
                        called.add((service, ops[node.func.attr]))
    assert ("s3", "HeadBucket") in called  # the scan sees botocore's own calls
    assert all(op in CLIENT_OPERATIONS[service] for service, op in called), called

    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    lean = aws_clients.new_session()
    for service in CLIENT_OPERATIONS:
        trimmed = lean.create_client(service, region_name="us-east-1").meta.service_model
        full = botocore.session.Session().get_service_model(service)
        discovery = full.endpoint_discovery_operation
        assert (discovery is None) == (trimmed.endpoint_discovery_operation is None), service
        if discovery is not None:
            assert trimmed.endpoint_discovery_operation.name == discovery.name


def test_trimmed_clients_have_the_listed_operations_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    session = aws_clients.new_session()
    for service, operations in CLIENT_OPERATIONS.items():
        client = session.create_client(service, region_name="us-east-1")
        assert set(client.meta.service_model.operation_names) == operations
        for operation in operations:
            assert callable(getattr(client, xform_name(operation)))
        # Every error of the service is still a class on client.exceptions.
        errors = {n for n, s in full_model(service)["shapes"].items() if s.get("exception")}
        assert errors and all(hasattr(client.exceptions, name) for name in errors)


def test_calling_an_operation_that_was_left_out_says_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    client = aws_clients.new_session().create_client("s3", region_name="us-east-1")
    with pytest.raises(AttributeError, match=r"put_bucket_policy.*LANCETX_AWS_MODEL_CACHE=off"):
        _ = client.put_bucket_policy
    assert not hasattr(client, "_no_such_private")
    assert getattr(client, "no_such_thing", None) is None

    monkeypatch.setenv(CACHE_ENV, "off")
    whole = aws_clients.new_session().create_client("s3", region_name="us-east-1")
    assert callable(whole.put_bucket_policy)


def test_every_shape_an_operation_or_error_reaches_is_kept() -> None:
    for service, _operations in CLIENT_OPERATIONS.items():
        trimmed = trim_service_model(service, full_model(service))
        shapes = trimmed["shapes"]
        refs = [
            ref
            for op in trimmed["operations"].values()
            for ref in (op.get("input"), op.get("output"), *op.get("errors", ()))
            if ref
        ]
        for shape in shapes.values():
            refs += list(shape.get("members", {}).values())
            refs += [shape[k] for k in ("member", "key", "value") if k in shape]
        assert refs and all(ref["shape"] in shapes for ref in refs), service
        assert len(shapes) < len(full_model(service)["shapes"])


def test_only_operations_refuses_an_operation_the_model_lacks() -> None:
    with pytest.raises(KeyError, match="NoSuchOperation"):
        only_operations(full_model("s3"), ["GetObject", "NoSuchOperation"])


def test_documentation_goes_but_a_member_named_documentation_stays() -> None:
    model = {
        "documentation": "the service",
        "operations": {
            "Op": {
                "documentation": "op",
                "documentationUrl": "https://example.com",
                "input": {"shape": "In", "documentation": "ref"},
                "errors": [{"shape": "Err", "documentation": "err"}],
            }
        },
        "shapes": {
            "In": {
                "type": "structure",
                "documentation": "shape",
                "members": {"documentation": {"shape": "S", "documentation": "member"}},
            },
            "L": {"type": "list", "member": {"shape": "S", "documentation": "x"}},
            "S": {"type": "string"},
            "Err": {"type": "structure", "members": {}, "exception": True},
        },
    }
    assert without_documentation(model) == {
        "operations": {"Op": {"input": {"shape": "In"}, "errors": [{"shape": "Err"}]}},
        "shapes": {
            "In": {"type": "structure", "members": {"documentation": {"shape": "S"}}},
            "L": {"type": "list", "member": {"shape": "S"}},
            "S": {"type": "string"},
            "Err": {"type": "structure", "members": {}, "exception": True},
        },
    }


def test_a_model_lacking_a_listed_operation_is_trimmed_to_those_it_has() -> None:
    model = full_model("s3")
    del model["operations"]["CopyObject"]
    trimmed = trim_service_model("s3", model)
    assert set(trimmed["operations"]) == CLIENT_OPERATIONS["s3"] - {"CopyObject"}


# ------------------------------------------------------- endpoint rule-set parameters


def rule_set(service: str) -> Any:
    loader = botocore.session.Session().get_component("data_loader")
    return json.loads(json.dumps(loader.load_service_model(service, "endpoint-rule-set-1")))


def context_params(model: dict[str, Any], operation: str) -> set[str]:
    shape = model["shapes"][model["operations"][operation]["input"]["shape"]]
    return {
        member["contextParam"]["name"]
        for member in shape.get("members", {}).values()
        if "contextParam" in member
    }


def test_context_params_no_endpoint_rule_reads_are_dropped() -> None:
    """S3 declares ``Key``, ``Prefix`` and ``CopySource`` as endpoint parameters that no
    rule reads; the trimmed model no longer passes them (``Bucket`` is read: kept)."""
    full, rules = full_model("s3"), rule_set("s3")
    read = {
        p for p in ("Key", "Prefix", "CopySource", "Bucket") if f'"ref": "{p}"' in json.dumps(rules)
    }
    assert read == {"Bucket"}  # what this botocore's S3 rule set reads of them
    trimmed = trim_service_model("s3", full_model("s3"), rules)
    for operation in ("GetObject", "HeadObject", "PutObject", "CopyObject", "ListObjectsV2"):
        assert "Bucket" in context_params(full, operation)
        assert context_params(trimmed, operation) == {"Bucket"}, operation
    assert context_params(full, "GetObject") >= {"Bucket", "Key"}
    # Without a rule set (none found), nothing changes.
    untouched = trim_service_model("s3", full_model("s3"))
    assert context_params(untouched, "GetObject") == context_params(full, "GetObject")


class _Stop(Exception):
    pass


def _stop(request: Any, **_: Any) -> None:
    raise _Stop(request.url)


def test_a_get_of_each_new_key_does_not_evaluate_the_rule_set_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """botocore caches a resolved endpoint by its parameters: with ``Key`` among them
    every new object key evaluated S3's whole rule set again (about a quarter of a
    GET's CPU). The endpoint is the same either way."""
    from botocore.endpoint_provider import RuleSet

    evaluations: list[object] = []
    original = RuleSet.evaluate

    def counted(self: Any, input_parameters: Any) -> Any:
        evaluations.append(input_parameters)
        return original(self, input_parameters)

    monkeypatch.setattr(RuleSet, "evaluate", counted)
    urls = {}
    for cache in (str(tmp_path), "off"):  # trimmed models, and botocore's whole ones
        monkeypatch.setenv(CACHE_ENV, cache)
        client = aws_clients.new_session().create_client(
            "s3",
            region_name="eu-west-1",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )
        client.meta.events.register("before-send", _stop)
        evaluations.clear()
        sent = []
        for key in ("a/1.manifest", "a/2.manifest", "b c/3+x.manifest"):
            with pytest.raises(_Stop) as stopped:
                client.get_object(Bucket="some-bucket", Key=key)
            sent.append(str(stopped.value))
        urls[cache] = (sent, len(evaluations))
    trimmed_urls, trimmed_evaluations = urls[str(tmp_path)]
    whole_urls, whole_evaluations = urls["off"]
    assert trimmed_urls == whole_urls
    assert whole_evaluations == 3  # botocore's own models: one evaluation per key
    assert trimmed_evaluations == 1
